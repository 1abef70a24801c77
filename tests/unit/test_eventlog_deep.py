"""``pipeline jobs show`` over a deep ``<ns>.events``, without Kafka: a fake consumer and a fake
clock. Its ``--timeout`` bounded the whole read of the topic, so a lookup on a topic that takes
longer to read failed as though Kafka were down, while Kafka answered all along."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Message

from pipeline import Settings
from pipeline._codec import EventCodec
from pipeline._deadletters import _reader
from pipeline._eventlog import job_history
from pipeline._records import Event

from .test_deadletters_reader import SECONDS_PER_CONSUME, Clock, clock

__all__ = ["clock"]  # the fixture

EVENTS = "ns.events"


class EventsConsumer:
    """``count`` events on one partition of ``<ns>.events``, one per ``consume()``, each call
    taking :data:`SECONDS_PER_CONSUME` of the fake clock."""

    def __init__(self, clock: Clock, count: int) -> None:
        codec = EventCodec()
        self.clock = clock
        self.values = [
            codec.encode(
                Event(
                    job_id=f"j{n % 3}",
                    job_type="t",
                    kind="started",
                    attempt=1,
                    priority="default",
                    at=n,
                )
            )
            for n in range(count)
        ]
        self.queue: list[Message] = []

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return (0, len(self.values) if tp.topic == EVENTS else 0)

    def assign(self, partitions: list[Any]) -> None:
        self.queue = [
            Message(topic=EVENTS, partition=0, offset=n, key=f"j{n % 3}".encode(), value=value)
            for tp in partitions
            if tp.topic == EVENTS
            for n, value in enumerate(self.values)
            if n >= tp.offset
        ]

    def consume(self, count: int, timeout: float) -> list[Message]:
        self.clock.now += SECONDS_PER_CONSUME
        return [self.queue.pop(0)]

    def unassign(self) -> None:
        self.queue = []

    def poll(self, timeout: float) -> None:
        return None

    def close(self) -> None:
        return None


def test_a_lookup_on_a_deep_events_topic_succeeds_while_kafka_keeps_answering(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer = EventsConsumer(clock, count=15)  # 6 s of reading, against 1 s of --timeout
    monkeypatch.setattr(_reader, "Consumer", lambda conf: consumer)
    history = job_history(Settings(namespace="ns"), "j1", timeout=1.0, letters=lambda job: [])
    assert history.scanned == 15
    assert [event.at for event in history.events] == [1, 4, 7, 10, 13]
