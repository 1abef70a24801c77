"""``pipeline jobs show`` over a deep ``<ns>.events``, without Kafka: a fake consumer and a fake
clock. Its ``--timeout`` bounded the whole read of the topic, so a lookup on a topic that takes
longer to read failed as though Kafka were down, while Kafka answered all along."""

from __future__ import annotations

import pytest

from pipeline import Settings
from pipeline._codec import EventCodec
from pipeline._deadletters import _reader
from pipeline._eventlog import job_history
from pipeline._records import Event

from .test_deadletters_reader import Clock, SlowConsumer, clock

__all__ = ["clock"]  # the fixture

EVENTS = "ns.events"


class EventsConsumer(SlowConsumer):
    """``count`` events of jobs j0, j1 and j2 in turn on one partition of ``<ns>.events``, one
    per ``consume()``, each call taking :data:`SECONDS_PER_CONSUME` of the fake clock."""

    def __init__(self, clock: Clock, count: int) -> None:
        super().__init__(clock, letters=0)
        codec = EventCodec()
        self.topic = EVENTS
        self.keys = [f"j{n % 3}".encode() for n in range(count)]
        self.values = [
            codec.encode(
                Event(
                    job_id=f"j{n % 3}", job_type="t", kind="started", attempt=1,
                    priority="default", at=n,
                )
            )
            for n in range(count)
        ]  # fmt: skip


def test_a_lookup_on_a_deep_events_topic_succeeds_while_kafka_keeps_answering(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    consumer = EventsConsumer(clock, count=15)  # 6 s of reading, against 1 s of --timeout
    monkeypatch.setattr(_reader, "Consumer", lambda conf: consumer)
    history = job_history(Settings(namespace="ns"), "j1", timeout=1.0, letters=lambda job: [])
    assert history.scanned == 15
    assert [event.at for event in history.events] == [1, 4, 7, 10, 13]


def test_a_lookup_counts_the_job_s_records_it_cannot_decode(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Events of a newer schema (an unknown writer fingerprint): "nothing known" blamed the
    # retention or the events level, where the reader could not read what was there.
    consumer = EventsConsumer(clock, count=6)
    consumer.values[1] = consumer.values[4] = b"\xc3\x01" + bytes(8) + b"newer"
    monkeypatch.setattr(_reader, "Consumer", lambda conf: consumer)
    history = job_history(Settings(namespace="ns"), "j1", timeout=10.0, letters=lambda job: [])
    assert history.unreadable == 2
    assert not history.found
