"""A progress record always fits in one message of the leader's producer.

The record names the held offsets as runs, so its size grows with the runs, not the offsets:
held offsets that alternate with moved ones, or a burst whose jobs fall due out of offset order,
made a record larger than ``message.max.bytes`` long before the count bound. The producer
refused it, the transaction aborted, and every next term wrote it again: nothing more of the
namespace was committed. The leader now pauses the partition before a record could outgrow a
message, in whatever order its jobs fall due.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from pipeline._codec import JobCodec
from pipeline._job import Job, now_ms
from pipeline._messagesize import PRODUCE_OVERHEAD
from pipeline._settings import Settings
from pipeline._transactions import Transactions
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._progress import PartitionProgress, SavedProgress
from pipeline_scheduler._session import LeaderSession

from .test_held_bound import Consumer

MAX_BYTES = 5_000  # the producer's message.max.bytes in these tests
SOURCE = ("pipeline.deferred", 0)
CODEC = JobCodec()


class Producer:
    """librdkafka's local size check (``message.max.bytes``) and nothing else of a producer."""

    def __init__(self) -> None:
        self.written: list[tuple[str, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, **_: Any) -> None:
        if len(value) + len(key or b"") + PRODUCE_OVERHEAD > MAX_BYTES:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.written.append((topic, value))

    def begin_transaction(self) -> None:
        pass

    def send_offsets_to_transaction(self, *_: Any) -> None:
        pass

    def commit_transaction(self, *_: Any) -> None:
        pass

    def abort_transaction(self, *_: Any) -> None:
        pass

    def poll(self, *_: Any) -> int:
        return 0

    def flush(self, *_: Any) -> int:
        return 0


@pytest.fixture
def session() -> Iterator[LeaderSession]:
    # No broker is contacted: the producer and the consumer are fakes.
    settings = Settings(
        bootstrap_servers="localhost:1", kafka={"message.max.bytes": str(MAX_BYTES)}
    )
    made = LeaderSession(settings, SchedulerMetrics(), [])
    made._consumer = Consumer()  # type: ignore[assignment]
    made.txn = Transactions(
        Producer(),  # type: ignore[arg-type]
        name="the scheduler's transactional producer",
        timeout_s=0.1,
        attempts=1,
        sleep=lambda _: None,
    )
    made.progress[SOURCE] = made.new_progress(SOURCE, 0)
    try:
        yield made
    finally:
        made._consumer = None
        made.close()


def deferred(offset: int, due_ms: int) -> Message:
    job = Job(id=f"job-{offset}", type="t", payload=b"{}", not_before=due_ms)
    return Message(
        topic=SOURCE[0],
        partition=0,
        offset=offset,
        key=None,
        value=CODEC.encode(job),
        timestamp=(1, now_ms()),
    )


def written(session: LeaderSession, topic: str) -> list[bytes]:
    producer: Producer = session.txn.producer  # type: ignore[assignment]
    return [value for t, value in producer.written if t == topic]


def drain(session: LeaderSession, messages: list[Message], until: int) -> None:
    """Route ``messages`` (committing every thousand), then release everything due up to
    ``until`` in steps of 100 ms, committing each step, until nothing is parked or paused."""
    now = now_ms()
    for i, message in enumerate(messages):
        session._handle(message, now)
        if i % 1000 == 999:
            session._commit()
    session._commit()
    clock = now
    consumer: Consumer = session._consumer  # type: ignore[assignment]
    while clock < until or consumer.paused:
        clock += 100
        session._release(clock)
        session._unpark(clock)
        session._commit()
        assert clock < until + 600_000, "a partition stayed paused"


@pytest.mark.parametrize(
    "pattern",
    [
        # Every other job due within the horizon (held), the rest in an hour (moved to a tier):
        # a run per held job.
        "alternating",
        # One burst, all held: one run while held, but the even offsets fall due first, so the
        # releases split it into a run per odd offset.
        "burst due out of order",
    ],
)
def test_no_transaction_fails_on_a_progress_record_larger_than_a_message(
    session: LeaderSession, pattern: str
) -> None:
    now = now_ms()
    count = 4_000  # a record of 4 bytes or more per held job would not fit: 2,000 are
    if pattern == "alternating":
        dues = [now + (10_000 + i if i % 2 == 0 else 3_600_000) for i in range(count)]
    else:
        dues = [now + 10_000 + (i % 2) * 10_000 + i for i in range(count)]
    progress = session.progress[SOURCE]
    drain(session, [deferred(i, due) for i, due in enumerate(dues)], now + 25_000)
    # Every job was routed once, every transaction committed: no record was refused.
    names = session.names
    released = written(session, names.jobs("default"))
    moved = [v for topic in session.tier_topics for v in written(session, topic)]
    assert len(released) + len(moved) == count
    assert len({CODEC.decode(v).id for v in released + moved}) == count
    assert progress.position == count
    records = written(session, names.scheduler_state)
    assert max(map(len, records)) <= progress.room < MAX_BYTES
    assert SavedProgress.decode(records[-1]).held == ()


def test_runs_are_counted_as_offsets_are_held_and_released() -> None:
    rnd = random.Random(7)
    progress = PartitionProgress(0)
    held: list[int] = []
    for offset in range(2000):
        progress.delivered(offset)
        if rnd.random() < 0.7:
            progress.hold(offset)
            held.append(offset)
        progress.processed(offset)
        if held and rnd.random() < 0.4:
            progress.release(held.pop(rnd.randrange(len(held))))
        ordered = sorted(held)
        runs = sum(1 for i, o in enumerate(ordered) if i == 0 or ordered[i - 1] != o - 1)
        assert progress.runs == runs


@pytest.mark.parametrize("room", [400, 5_000])
@pytest.mark.parametrize("every", [1, 2, 3, 1000])
def test_a_partition_held_to_the_bound_fits_its_room_in_any_release_order(
    room: int, every: int
) -> None:
    progress = PartitionProgress(0, room=room)
    held: list[int] = []
    offset = 0
    while not progress.full:
        progress.delivered(offset)
        if offset % every == 0:
            progress.hold(offset)
            held.append(offset)
        progress.processed(offset)
        offset += 1
    largest = 0
    # The worst order: every other held offset first, splitting every run.
    for offset in held[::2] + held[1::2]:
        progress.release(offset)
        saved = progress.saved()
        assert saved is not None
        largest = max(largest, len(saved.encode()))
        assert largest <= room
    assert largest > room // 2  # and the bound is not far from the real size
    assert progress.may_resume
