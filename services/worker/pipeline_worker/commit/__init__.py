"""What reaches Kafka for finished offsets: tracking, marks, committer, moves."""
