"""The leader's handling of ``<ns>.schedules`` messages, without a broker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import TopicPartition

from pipeline._codec import ScheduleCodec
from pipeline._records import Schedule
from pipeline._schedule import make_schedule
from pipeline._settings import Settings
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._session import LeaderSession


@dataclass
class Message:
    """The part of a confluent_kafka Message the session reads from the schedules topic."""

    _key: bytes | None
    _value: bytes | None
    _offset: int
    _partition: int = 0
    _timestamp_ms: int = 0

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset

    def partition(self) -> int:
        return self._partition

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp_ms)  # TIMESTAMP_CREATE_TIME


@pytest.fixture
def session() -> Iterator[LeaderSession]:
    # No broker is contacted: nothing here starts a transaction or a consumer.
    made = LeaderSession(Settings(bootstrap_servers="localhost:1"), SchedulerMetrics(), [])
    made.firing.begin({0: (0, 100)})
    try:
        yield made
    finally:
        made.close()


def invalid_gauge(session: LeaderSession) -> float | None:
    return session.metrics.registry.get_sample_value("pipeline_scheduler_schedules_invalid")


def test_bad_records_are_counted_and_replaced(session: LeaderSession) -> None:
    codec = ScheduleCodec()
    good = make_schedule("good", cron="* * * * *", job_type="t")
    never = Schedule(name="never", cron="0 3 30 2 *", job_type="t", payload=b"{}")
    messages = [
        Message(b"good", codec.encode(good), 0),
        Message(b"never", codec.encode(never), 1),
        Message(b"junk", b"\xff\xfe", 2),
        Message(b"\xff", b"\xc3\x01", 3),  # a key that is not UTF-8 either
    ]
    for message in messages:
        session.firing.read(message)  # type: ignore[arg-type]
    assert set(session.firing.cron.schedules()) == {"good"}
    assert set(session.firing.cron.invalid) == {"never", "junk", "\ufffd"}
    assert invalid_gauge(session) == 3.0
    session.firing.read(Message(b"junk", None, 4))  # type: ignore[arg-type]
    fixed = make_schedule("never", cron="* * * * *", job_type="t")
    session.firing.read(Message(b"never", codec.encode(fixed), 5))  # type: ignore[arg-type]
    assert set(session.firing.cron.schedules()) == {"good", "never"}
    assert invalid_gauge(session) == 1.0
    session.close()
    assert invalid_gauge(session) == 0.0  # a standby skips nothing


def test_a_schedule_in_several_partitions_takes_the_record_that_wins(
    session: LeaderSession,
) -> None:
    # Written by earlier releases to the partitions its name hashed to as partitions were added.
    codec = ScheduleCodec()
    hourly = codec.encode(make_schedule("a", cron="0 * * * *", job_type="t"))
    minutely = codec.encode(make_schedule("a", cron="* * * * *", job_type="t"))
    firing = session.firing
    firing.read(Message(b"a", minutely, 0, _partition=2, _timestamp_ms=2_000))  # type: ignore[arg-type]
    firing.read(Message(b"a", hourly, 7, _partition=1, _timestamp_ms=1_000))  # type: ignore[arg-type]
    assert firing.cron.schedules()["a"].cron == "* * * * *"  # the newer one, though read first
    # This release writes to partition 0: its last record wins, whatever the stamps say.
    firing.read(Message(b"a", hourly, 0, _partition=0, _timestamp_ms=500))  # type: ignore[arg-type]
    assert firing.cron.schedules()["a"].cron == "0 * * * *"
    firing.read(Message(b"a", None, 1, _partition=0, _timestamp_ms=400))  # type: ignore[arg-type]
    firing.read(Message(b"a", minutely, 8, _partition=2, _timestamp_ms=9_000))  # type: ignore[arg-type]
    assert "a" not in firing.cron.schedules()


def test_nothing_fires_before_every_partition_is_read_to_where_it_ended() -> None:
    made = LeaderSession(Settings(bootstrap_servers="localhost:1"), SchedulerMetrics(), [])
    topic = made.names.schedules
    positions = {0: 5, 1: 0, 2: 3}

    class Consumer:
        def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
            return [TopicPartition(topic, tp.partition, positions[tp.partition]) for tp in tps]

    try:
        made.firing.begin({0: (0, 5), 1: (0, 0), 2: (2, 4)})
        assert not made.firing.caught_up(Consumer())  # type: ignore[arg-type]
        positions[2] = 4
        assert made.firing.caught_up(Consumer())  # type: ignore[arg-type]
        made.firing.begin({0: (3, 3)})
        assert made.firing.caught_up(Consumer())  # type: ignore[arg-type]  # nothing to read
    finally:
        made.close()
