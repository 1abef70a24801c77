"""The leader's handling of ``<ns>.schedules`` messages, without a broker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

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

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def offset(self) -> int:
        return self._offset


@pytest.fixture
def session() -> Iterator[LeaderSession]:
    # No broker is contacted: nothing here starts a transaction or a consumer.
    made = LeaderSession(Settings(bootstrap_servers="localhost:1"), SchedulerMetrics(), [])
    made.firing.end = 100
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
