"""``read_dead_letters`` over a deep topic, without Kafka: a fake consumer and a fake clock."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from pipeline import Settings
from pipeline._codec import DeadLetterCodec
from pipeline._deadletters import _reader, read_dead_letters
from pipeline._errors import KafkaUnavailableError
from pipeline._records import DeadLetter

NS = "ns"
DLQ, STATE = f"{NS}.dlq", f"{NS}.dlq-state"
SECONDS_PER_CONSUME = 0.4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class SlowConsumer:
    """``letters`` records on one partition of ``<ns>.dlq``, one per ``consume()``, each call
    taking :data:`SECONDS_PER_CONSUME` of the fake clock; after ``stall_after`` records, only
    transport errors (Kafka stopped answering)."""

    def __init__(self, clock: Clock, letters: int, stall_after: int | None = None) -> None:
        codec = DeadLetterCodec()
        self.clock = clock
        self.values = [
            codec.encode(
                DeadLetter(
                    id=f"dl-{n}",
                    reason="max_attempts",
                    message="boom",
                    source_topic=f"{NS}.jobs.default",
                    source_partition=0,
                    source_offset=n,
                    dead_at=n,
                )
            )
            for n in range(letters)
        ]
        self.keys: list[bytes | None] = [None] * letters
        self.topic = DLQ
        self.stall_after = stall_after
        self.queue: list[Message] = []

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return (0, len(self.values) if tp.topic == self.topic else 0)

    def assign(self, partitions: list[Any]) -> None:
        self.queue = [
            Message(topic=self.topic, partition=0, offset=n, key=self.keys[n], value=value)
            for tp in partitions
            if tp.topic == self.topic
            for n, value in enumerate(self.values)
            if n >= tp.offset
        ]

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.clock.now += SECONDS_PER_CONSUME
        if self.stall_after is not None and (self.queue[0].offset() or 0) >= self.stall_after:
            return [
                Message(
                    topic=self.topic,
                    partition=0,
                    offset=-1,
                    error=KafkaError(KafkaError._TRANSPORT),
                )
            ]
        return [self.queue.pop(0)]

    def unassign(self) -> None:
        self.queue = []

    def poll(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        return None


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr("pipeline._deadletters._reader.time.monotonic", fake.monotonic)
    monkeypatch.setattr(_reader, "cluster_metadata", lambda *args, **kwargs: object())
    monkeypatch.setattr(_reader, "topic_partitions", lambda *args, **kwargs: [0])
    return fake


def test_a_read_longer_than_the_timeout_succeeds_while_kafka_keeps_answering(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--timeout is how long Kafka may take to answer: a deep DLQ, read for longer than that
    with records coming all along, made every command fail as if Kafka were down."""
    consumer = SlowConsumer(clock, letters=20)  # 8 s of reading
    monkeypatch.setattr(_reader, "Consumer", lambda conf: consumer)
    snapshot = read_dead_letters(Settings(namespace=NS), timeout=1.0)
    assert [s.letter.id for s in snapshot.letters] == [f"dl-{n}" for n in range(20)]
    assert clock.now - 1000.0 > 1.0 * 5


def test_a_read_still_fails_when_kafka_stops_answering_half_way(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer = SlowConsumer(clock, letters=20, stall_after=5)
    monkeypatch.setattr(_reader, "Consumer", lambda conf: consumer)
    start = clock.now
    with pytest.raises(KafkaUnavailableError, match=r"did not answer within 1s .*1 partition"):
        read_dead_letters(Settings(namespace=NS), timeout=1.0)
    # Five records, then errors only: it gave up about one timeout after the last record.
    assert clock.now - start == pytest.approx(5 * SECONDS_PER_CONSUME + 1.2, abs=0.01)
