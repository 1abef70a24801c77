"""The leader's reading of delayed jobs, without a broker: how long the head of a wait-tier
partition waits (the tier's delay after it was written, and never past the moment routing
would want its job out of the tier), and when what it writes is counted (once committed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Message

from pipeline._codec import JobCodec
from pipeline._job import Job, now_ms
from pipeline._settings import Settings
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._progress import PartitionProgress
from pipeline_scheduler._session import LeaderSession

HORIZON_MS = 120_000  # the default horizon


class Paused:
    """The part of the consumer the session pauses and resumes partitions with."""

    def __init__(self) -> None:
        self.paused: set[tuple[str, int]] = set()
        self.pauses = 0
        """Calls to pause()."""

    def pause(self, partitions: list[Any]) -> None:
        self.paused.update((p.topic, p.partition) for p in partitions)
        self.pauses += 1

    def resume(self, partitions: list[Any]) -> None:
        self.paused.difference_update((p.topic, p.partition) for p in partitions)


@pytest.fixture
def session() -> Iterator[LeaderSession]:
    # No broker is contacted: nothing here starts a transaction or a consumer.
    made = LeaderSession(Settings(bootstrap_servers="localhost:1"), SchedulerMetrics(), [])
    made._consumer = Paused()  # type: ignore[assignment]
    for topic in made.tier_topics:
        made.progress[topic, 0] = PartitionProgress()  # as start() reads them: nothing yet
    try:
        yield made
    finally:
        made._consumer = None
        made.close()


def in_tier(
    session: LeaderSession, tier: int, offset: int, written_ms: int, due_ms: int
) -> Message:
    job = Job(id=f"job-{offset}", type="t", payload=b"{}", not_before=due_ms)
    return Message(
        topic=session.tier_topics[tier],
        partition=0,
        offset=offset,
        key=None,
        value=JobCodec().encode(job),
        timestamp=(1, written_ms),
    )


def test_a_head_due_before_its_tier_s_delay_leaves_when_routing_wants_it(
    session: LeaderSession,
) -> None:
    # Written to the 3,600 s tier for a job due in 15 minutes: the tiers changed since (a
    # middle tier removed), and the job must not wait an hour behind the tier's delay.
    now = now_ms()
    due = now + 15 * 60_000
    session._handle(in_tier(session, 2, 0, now, due), now)
    assert session._consumer.paused == {(session.tier_topics[2], 0)}  # type: ignore[union-attr]
    assert session.next_wake() == due - HORIZON_MS // 2
    session._unpark(due - HORIZON_MS // 2)
    assert session.queue.next_due() == due  # held in memory, released on time
    assert session._consumer.paused == set()  # type: ignore[union-attr]


def test_a_head_stamped_ahead_of_this_clock_waits_its_tier_s_delay_from_now(
    session: LeaderSession,
) -> None:
    # A leader whose clock ran an hour ahead moved it to the 60 s tier.
    now = now_ms()
    due = now + 10 * 60_000
    session._handle(in_tier(session, 0, 0, now + 3_600_000, due), now)
    assert session.next_wake() == now + 60_000


def test_the_next_head_of_a_parked_partition_gets_its_own_wake(session: LeaderSession) -> None:
    now = now_ms()
    first = in_tier(session, 0, 0, now, now + 10 * 60_000)
    second = in_tier(session, 0, 1, now + 30_000, now + 10 * 60_000)
    session._handle(first, now)
    session._handle(second, now)
    assert session.next_wake() == now + 60_000
    session.txn = Sent()  # type: ignore[assignment]
    session._unpark(now + 60_000)  # the first goes on to the next tier; the second waits
    assert session.next_wake() == now + 90_000


class Sent:
    """The leader's transaction, as far as a move to another tier uses it."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def produce(self, topic: str, value: bytes, key: Any, **_: Any) -> None:
        self.sent.append(topic)

    def close(self) -> None:
        pass


def released(session: LeaderSession) -> float | None:
    return session.metrics.registry.get_sample_value("pipeline_scheduler_releases_total")


def test_a_release_is_counted_once_its_transaction_commits(session: LeaderSession) -> None:
    session.txn = Sent()  # type: ignore[assignment]
    session.progress["pipeline.deferred", 0] = PartitionProgress()
    now = now_ms()
    job = Job(id="due", type="t", payload=b"{}", not_before=now)
    value = JobCodec().encode(job)
    message = Message(
        topic="pipeline.deferred", partition=0, offset=0, key=None, value=value, timestamp=(1, now)
    )
    session._handle(message, now)
    assert session.txn.sent == ["pipeline.jobs.default"]  # type: ignore[attr-defined]
    assert released(session) == 0.0  # written, not committed: an abort would release it again
    session._tally.committed()
    assert released(session) == 1.0
