"""The leader never holds more offsets of a partition than a progress record may name.

A record naming more is refused by the next leader, which then reads the partition from its
committed offset and releases again what was released above it. So a partition that holds as
many jobs as the bound stops being read (paused, the rest of what it delivered parked) until
releases make room, and every record the leader writes reads back.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Message

from pipeline._codec import JobCodec
from pipeline._job import Job, now_ms
from pipeline._settings import Settings
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._progress import MAX_HELD, PartitionProgress, SavedProgress
from pipeline_scheduler._session import LeaderSession
from pipeline_scheduler._state import load_state

from .test_tier_heads import Paused

BOUND = 50
SOURCE = ("pipeline.deferred", 0)


class Consumer(Paused):
    """The part of the consumer a step's routing and commit use."""

    def consumer_group_metadata(self) -> None:
        return None


class Transaction:
    """The leader's transaction: what it wrote, by topic."""

    open = True

    def __init__(self) -> None:
        self.written: list[tuple[str, bytes | None]] = []

    def produce(self, topic: str, value: bytes | None, key: Any = None, **_: Any) -> None:
        self.written.append((topic, value))

    def commit(self, offsets: Any, metadata: Any) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.fixture
def session() -> Iterator[LeaderSession]:
    # No broker is contacted: nothing here starts a real transaction or consumer.
    made = LeaderSession(
        Settings(bootstrap_servers="localhost:1"), SchedulerMetrics(), [], max_held=BOUND
    )
    made._consumer = Consumer()  # type: ignore[assignment]
    made.txn = Transaction()  # type: ignore[assignment]
    made.progress[SOURCE] = PartitionProgress(0, max_held=BOUND)
    try:
        yield made
    finally:
        made._consumer = None
        made.close()


_CODEC = JobCodec()


def deferred(offset: int, due_ms: int) -> Message:
    job = Job(id=f"job-{offset}", type="t", payload=b"{}", not_before=due_ms)
    value = _CODEC.encode(job)
    return Message(
        topic=SOURCE[0], partition=0, offset=offset, key=None, value=value, timestamp=(1, 0)
    )


def records(session: LeaderSession) -> list[SavedProgress]:
    """The progress records written so far, read back as the next leader reads them."""
    txn: Transaction = session.txn  # type: ignore[assignment]
    state = session.names.scheduler_state
    return [SavedProgress.decode(v or b"") for t, v in txn.written if t == state]


def test_a_partition_is_paused_at_the_bound_and_read_again_below_it(
    session: LeaderSession,
) -> None:
    now = now_ms()
    first_due = now + 10_000  # within the horizon: held in memory
    for offset in range(120):
        session._handle(deferred(offset, first_due + offset * 100), now)
    progress = session.progress[SOURCE]
    consumer: Consumer = session._consumer  # type: ignore[assignment]
    assert progress.held_count == BOUND
    assert consumer.paused == {SOURCE}
    assert len(progress.parked) == 120 - BOUND
    assert session.parked == 120 - BOUND
    session._commit()
    clock = first_due
    while consumer.paused:
        clock += 100  # one more job due: released, and one parked message takes its place
        session._release(clock)
        session._unpark(clock)
        session._commit()
        assert progress.held_count <= BOUND
        if progress.parked:
            assert progress.held_count == BOUND
        assert (SOURCE in consumer.paused) == (progress.held_count > int(BOUND * 0.9))
    assert not progress.parked
    assert progress.position == 120
    saved = records(session)  # every one reads back with the bound the leader wrote it with
    assert max(len(record.held) for record in saved) == BOUND
    assert saved[-1].position == 120


def test_every_record_reads_back_with_the_bound_however_many_are_due(
    session: LeaderSession,
) -> None:
    now = now_ms()
    for offset in range(500):  # read in batches; every job due within the horizon
        session._handle(deferred(offset, now + 60_000 - offset), now)
        if offset % 100 == 99:
            session._release(now)
            session._unpark(now)
            session._commit()
    progress = session.progress[SOURCE]
    assert progress.held_count == BOUND
    assert len(progress.parked) == 500 - BOUND
    session._release(now + 60_000)  # all due: released, the parked ones routed, then resumed
    session._unpark(now + 60_000)
    session._commit()
    assert not progress.parked
    assert session._consumer.paused == set()  # type: ignore[union-attr]
    for record in records(session):
        assert len(record.held) <= BOUND
    jobs = [t for t, _ in session.txn.written if t == session.names.jobs("default")]  # type: ignore[attr-defined]
    assert len(jobs) == 500


def test_the_leader_writes_and_reads_back_with_one_bound_by_default() -> None:
    def default(function: Any) -> Any:
        return inspect.signature(function).parameters["max_held"].default

    assert PartitionProgress().max_held == MAX_HELD
    assert default(SavedProgress.decode) == MAX_HELD
    assert default(load_state) == MAX_HELD
    assert default(LeaderSession) == MAX_HELD


def test_a_full_partition_may_resume_once_it_holds_nine_tenths_of_the_bound() -> None:
    progress = PartitionProgress(0, max_held=10)
    for offset in range(10):
        assert not progress.full
        progress.hold(offset)
    assert progress.full
    assert not progress.may_resume
    progress.release(0)
    assert not progress.full
    assert progress.may_resume
