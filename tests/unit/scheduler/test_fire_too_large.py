"""A cron fire larger than the scheduler's producer sends, without a broker."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from pipeline._codec import DeadLetterCodec, ScheduleCodec
from pipeline._envelopes import EnvelopeFraming
from pipeline._records import DeadLetterReason
from pipeline._schedule import make_schedule
from pipeline._settings import Settings
from pipeline._transactions import Transactions
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._session import LeaderSession
from tests.unit.scheduler.test_session_schedules import Message
from tests.unit.test_transactions import FakeProducer

MAX_BYTES = 10_000


@pytest.fixture
def session() -> Iterator[LeaderSession]:
    settings = Settings(
        bootstrap_servers="localhost:1",
        namespace="acme",
        kafka={"message.max.bytes": str(MAX_BYTES)},
    )
    made = LeaderSession(settings, SchedulerMetrics(), [])
    made.txn = Transactions(FakeProducer(MAX_BYTES), name="test producer", sleep=lambda s: None)
    made.firing.ready = True
    try:
        yield made
    finally:
        made.close()


def test_a_fire_too_large_to_send_is_dead_lettered_and_the_rest_goes_on(
    session: LeaderSession,
) -> None:
    # The schedule record fits (another producer may send more); its fire, with the id, the
    # key and the schedule header added, does not. Refused, it aborted every transaction of
    # every term: no delayed job or other fire was released again.
    codec = ScheduleCodec()
    # Made 100 ms past a whole second, so that one fire (the next second's) is due 1 s later.
    made = make_schedule("big", cron="* * * * * *", job_type="t").created_at // 1000 * 1000 + 100
    big = replace(
        make_schedule("big", cron="* * * * * *", job_type="t", payload=b"x" * MAX_BYTES),
        created_at=made,
    )
    small = replace(make_schedule("small", cron="* * * * * *", job_type="t"), created_at=made)
    for offset, schedule in enumerate((big, small)):
        message = Message(schedule.name.encode(), codec.encode(schedule), offset)
        session.firing.read(message)  # type: ignore[arg-type]
    session.firing.fire(made + 1000, session.txn, "acme")
    session.txn.commit()
    producer: FakeProducer = session.txn.producer  # type: ignore[assignment]
    [committed] = producer.committed
    topics = [topic for topic, _ in committed]
    assert topics.count("acme.jobs.default") == 1  # the small schedule's fire
    assert topics.count("acme.scheduler-state") == 2  # both schedules go on from this fire
    [(_, value)] = [(t, v) for t, v in committed if t == "acme.dlq"]
    letter = DeadLetterCodec().decode(value or b"")
    assert letter.reason == DeadLetterReason.TOO_LARGE
    assert letter.job_type == "t"
    assert letter.source_topic == "acme.schedules"
    assert letter.source_offset == 0
    assert "big" in letter.message


def test_the_leaders_cron_fires_never_wait_for_a_schema_registry() -> None:
    """With envelopes written in the registry's format, the leader's codec registers the
    envelope's schema in the background: a fire while the registry is down is written
    single-object, instead of stopping every scheduler that took over."""
    settings = Settings(
        bootstrap_servers="localhost:1",
        namespace="acme",
        schema_registry={"url": "http://registry.invalid", "envelope": True},
    )
    made = LeaderSession(settings, SchedulerMetrics(), [])
    try:
        framing = made._codec.framing
        assert isinstance(framing, EnvelopeFraming)
        assert framing.writes
        assert framing.background
    finally:
        made.close()
