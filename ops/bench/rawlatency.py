"""The raw side of the latency benchmark: a plain confluent-kafka consumer in its own process.

``python -m ops.bench.rawlatency BOOTSTRAP TOPIC RECORD`` reads ``TOPIC`` from the beginning
in a new group and, for every message (whose value is the producer's ``time.time_ns()`` in
ASCII), appends ``<receive ns - value>`` to ``RECORD``, one ``os.write`` per line as the
worker's handler does, until SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid

from confluent_kafka import Consumer


def main(argv: list[str]) -> int:
    bootstrap_servers, topic, record = argv
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"raw-latency-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while not stopping:
            message = consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            now = time.time_ns()
            os.write(fd, f"{now - int(message.value() or b'0')}\n".encode())
    finally:
        os.close(fd)
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
