// Command producer enqueues pipeline jobs from Go, with hamba/avro and franz-go, as
// docs/wire-format.md describes. It prints one JSON line per job: id, kind, key, text.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pipeline/interop/envelope"
)

// produced is what the test reads back from stdout.
type produced struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	Key  string `json:"key"`
	Text string `json:"text"`
}

func main() {
	brokers := flag.String("brokers", "localhost:9092", "bootstrap servers")
	namespace := flag.String("namespace", "pipeline", "topic namespace")
	schemaPath := flag.String("schema", "schemas/pipeline/job.v1.avsc", "job schema file")
	immediate := flag.Int("immediate", 10, "unkeyed jobs")
	keyed := flag.Int("keyed", 10, "jobs with a business key")
	idempotent := flag.Int("idempotent", 10, "jobs with an idempotency key")
	delayed := flag.Int("delayed", 5, "jobs due later, written to <ns>.deferred")
	delay := flag.Duration("delay", 2*time.Second, "how far in the future delayed jobs are due")
	flag.Parse()

	encoder, err := envelope.NewEncoder(*schemaPath)
	if err != nil {
		log.Fatalf("job schema: %v", err)
	}
	// Keyed jobs: the default StickyKeyPartitioner hashes a key with Kafka's murmur2, as Java's
	// client and the Python library do. Unkeyed jobs: that partitioner sticks a burst to one
	// partition, so they go through a client that partitions round-robin (it ignores keys).
	common := []kgo.Opt{kgo.SeedBrokers(*brokers), kgo.RequiredAcks(kgo.AllISRAcks())}
	keyedClient, err := kgo.NewClient(common...)
	if err != nil {
		log.Fatalf("kafka client: %v", err)
	}
	defer keyedClient.Close()
	spreadClient, err := kgo.NewClient(append(common, kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))...)
	if err != nil {
		log.Fatalf("kafka client: %v", err)
	}
	defer spreadClient.Close()

	var (
		keyedRecords, spreadRecords []*kgo.Record
		out                         []produced
	)
	add := func(kind string, i int, key string, idempotencyKey *string, notBefore *int64, priority string) {
		text := fmt.Sprintf("Grüße, 世界 🚀 go %s %d", kind, i)
		payload, err := json.Marshal(map[string]any{"text": text, "n": i})
		if err != nil {
			log.Fatalf("payload: %v", err)
		}
		now := time.Now().UnixMilli()
		job := &envelope.Job{
			ID:              fmt.Sprintf("go-%s-%d-%d", kind, i, now),
			Type:            "interop.echo",
			Payload:         payload,
			PayloadEncoding: "JSON",
			Priority:        priority,
			Attempt:         1,
			MaxAttempts:     5,
			CreatedAt:       now,
			NotBefore:       notBefore,
			IdempotencyKey:  idempotencyKey,
			Headers:         map[string]string{"source": "go", "greeting": "Grüße"},
			Errors:          []envelope.AttemptError{},
		}
		value, err := encoder.Encode(job)
		if err != nil {
			log.Fatalf("encode: %v", err)
		}
		topic := *namespace + ".jobs." + priority
		if notBefore != nil {
			topic = *namespace + ".deferred"
		}
		record := &kgo.Record{Topic: topic, Value: value}
		if key == "" {
			spreadRecords = append(spreadRecords, record)
		} else {
			record.Key = []byte(key)
			keyedRecords = append(keyedRecords, record)
		}
		out = append(out, produced{ID: job.ID, Kind: kind, Key: key, Text: text})
	}
	for i := 0; i < *immediate; i++ {
		add("immediate", i, "", nil, nil, "default")
	}
	for i := 0; i < *keyed; i++ {
		add("keyed", i, fmt.Sprintf("customer-%d-ü", i), nil, nil, "default")
	}
	for i := 0; i < *idempotent; i++ {
		key := fmt.Sprintf("order-%d-%d-€", i, time.Now().UnixNano())
		add("idempotent", i, key, &key, nil, "default")
	}
	for i := 0; i < *delayed; i++ {
		due := time.Now().Add(*delay).UnixMilli()
		// A delayed job keeps its key on <ns>.deferred: the scheduler releases it with that key.
		add("delayed", i, fmt.Sprintf("reminder-%d", i), nil, &due, "high")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := keyedClient.ProduceSync(ctx, keyedRecords...).FirstErr(); err != nil {
		log.Fatalf("produce: %v", err)
	}
	if err := spreadClient.ProduceSync(ctx, spreadRecords...).FirstErr(); err != nil {
		log.Fatalf("produce: %v", err)
	}
	lines := json.NewEncoder(os.Stdout)
	for _, job := range out {
		if err := lines.Encode(job); err != nil {
			log.Fatalf("stdout: %v", err)
		}
	}
}
