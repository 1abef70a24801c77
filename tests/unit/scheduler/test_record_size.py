"""A progress record always fits in one message of the leader's producer.

The record names the held offsets as runs, so its size grows with the runs, not the offsets:
held offsets that alternate with moved ones, or a burst whose jobs fall due out of offset order,
made a record larger than ``message.max.bytes`` long before the count bound. The producer
refused it, the transaction aborted, and every next term wrote it again: nothing more of the
namespace was committed. The leader now pauses the partition before a record could outgrow a
message, in whatever order its jobs fall due.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

from pipeline._codec import JobCodec
from pipeline._job import now_ms
from pipeline._messagesize import PRODUCE_OVERHEAD
from pipeline._settings import Settings
from pipeline._transactions import Transactions
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._progress import PartitionProgress, SavedProgress, record_room
from pipeline_scheduler._session import LeaderSession
from pipeline_scheduler._state import progress_key

from .test_held_bound import Consumer, deferred

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


def written(session: LeaderSession, topic: str) -> list[bytes]:
    producer: Producer = session.txn.producer  # type: ignore[assignment]
    return [value for t, value in producer.written if t == topic]


def drain(session: LeaderSession, messages: list[Message], now: int, until: int) -> None:
    """Route ``messages`` at ``now`` (committing every thousand), then release everything due
    up to ``until`` in steps of 100 ms, committing each step, until nothing is parked or
    paused. The clock is the test's: how long building the messages took changes nothing."""
    for i, message in enumerate(messages):
        session._handle(message, now)
        if i % 1000 == 999:
            session._commit()
    session._commit()
    clock = now
    consumer: Consumer = session._consumer  # type: ignore[assignment]
    while clock < until or consumer.paused:
        clock = step(session, clock, until)


def read_and_drain(session: LeaderSession, messages: list[Message], now: int, until: int) -> None:
    """As :func:`drain`, but as a consumer reads: nothing more of a paused partition comes
    until it is resumed (routed at the clock of the step that reads it)."""
    consumer: Consumer = session._consumer  # type: ignore[assignment]
    pending = deque(messages)
    clock = now
    while pending or clock < until or consumer.paused:
        while pending and SOURCE not in consumer.paused:
            session._handle(pending.popleft(), clock)
        clock = step(session, clock, until)


def step(session: LeaderSession, clock: int, until: int) -> int:
    """100 ms later: release what is due, route what was parked, commit; the new clock."""
    clock += 100
    session._release(clock)
    session._unpark(clock)
    session._commit()
    assert clock < until + 600_000, "a partition stayed paused"
    return clock


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
    drain(session, [deferred(i, due) for i, due in enumerate(dues)], now, now + 25_000)
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


# --- a record committed by an earlier release, bounded by its count only, replayed -----------


def committed_record(room_share: float) -> SavedProgress:
    """A record as an earlier release wrote it: runs of 12 held offsets a gap of one apart
    (5 bytes each, ``1,12,``) in about ``room_share`` of the room of this leader's records
    (the count bound allowed that)."""
    runs = int(record_room(MAX_BYTES, len(progress_key(*SOURCE))) * room_share) // 5
    watermark = 10**9
    held = [watermark + 13 * run + i for run in range(runs) for i in range(12)]
    return SavedProgress.holding(watermark, held[-1] + 2, held)


def replay(session: LeaderSession, record: SavedProgress, more: int, now: int) -> list[Message]:
    """The messages a new leader reads from the record's watermark, and ``more`` new ones: of
    the jobs the record still holds, about one in two is due at ``now``, the others within the
    next 20 s (held again, and released in the order they fall due)."""
    session.progress[SOURCE] = session.new_progress(SOURCE, record.watermark, record)
    rnd = random.Random(3)
    return [
        deferred(offset, now - 1_000 if rnd.random() < 0.5 else now + rnd.randrange(20_000))
        for offset in range(record.watermark, record.position + more)
    ]


def routed_once(session: LeaderSession, record: SavedProgress, more: int) -> None:
    """Each job the record held or that came after it is released once; none it did not."""
    released = [CODEC.decode(v).id for v in written(session, session.names.jobs("default"))]
    offsets = [*record.held, *range(record.position, record.position + more)]
    assert sorted(released) == sorted(f"job-{offset}" for offset in offsets)
    assert session.progress[SOURCE].position == record.position + more


def test_a_replayed_record_of_an_earlier_release_grows_no_record_past_the_room(
    session: LeaderSession,
) -> None:
    # Read again, the jobs the record held are released one in two: the runs of 12 split,
    # and the records written until the replay is over named those split runs *and* the rest
    # of the committed record, which the bound did not count. They outgrew message.max.bytes:
    # the transaction aborted, and the next term replayed the same record, for good.
    record = committed_record(0.83)
    now = now_ms()
    drain(session, replay(session, record, 100, now), now, now + 25_000)
    routed_once(session, record, more=100)
    room = session.progress[SOURCE].room
    records = written(session, session.names.scheduler_state)
    assert max(map(len, records)) <= room
    assert SavedProgress.decode(records[-1]).held == ()


def test_a_replayed_record_with_no_room_left_is_routed_one_held_job_at_a_time(
    session: LeaderSession, caplog: pytest.LogCaptureFixture
) -> None:
    # Larger than this leader's room, but taken by the producer (it was, when committed):
    # holding nothing, the leader still routes the next message, and holds no second job
    # before the first is released, so that no record is larger than the committed one.
    record = committed_record(1.05)
    committed = len(record.encode())
    room = session.progress[SOURCE].room
    assert room < committed <= MAX_BYTES - PRODUCE_OVERHEAD - len(progress_key(*SOURCE))
    now = now_ms()
    with caplog.at_level(logging.WARNING, logger="pipeline.scheduler"):
        read_and_drain(session, replay(session, record, 100, now), now, now + 25_000)
    routed_once(session, record, more=100)
    records = written(session, session.names.scheduler_state)
    assert room < max(map(len, records)) <= committed
    assert SavedProgress.decode(records[-1]).held == ()
    assert_told_once(session, caplog, record)


@pytest.mark.parametrize("share", [0.985, 0.989])
def test_a_replayed_record_that_leaves_room_for_a_few_held_jobs_is_told_once(
    session: LeaderSession, caplog: pytest.LogCaptureFixture, share: float
) -> None:
    # Room for two to four held jobs beside the rest: not full for what the term holds, and
    # not told as if it were.
    record = committed_record(share)
    now = now_ms()
    with caplog.at_level(logging.WARNING, logger="pipeline.scheduler"):
        read_and_drain(session, replay(session, record, 100, now), now, now + 25_000)
    routed_once(session, record, more=100)
    assert_told_once(session, caplog, record)


def assert_told_once(
    session: LeaderSession, caplog: pytest.LogCaptureFixture, record: SavedProgress
) -> None:
    """Slow, and said so: once in the term, though the partition paused again and again."""
    assert session._consumer.pauses > 1  # type: ignore[union-attr]
    [told] = [r.getMessage() for r in caplog.records]
    assert told.startswith(f"{SOURCE[0]} [0]: the progress record committed before this leader")
    assert f"until the partition is read up to offset {record.position}," in told


def test_a_replayed_record_the_producer_refuses_pauses_its_partition_with_an_error(
    session: LeaderSession, caplog: pytest.LogCaptureFixture
) -> None:
    # message.max.bytes lowered since the record was committed: every record naming what is
    # left of it would be refused, and abort the transaction of every other partition too.
    record = committed_record(1.2)
    now = now_ms()
    messages = replay(session, record, 0, now)
    with caplog.at_level(logging.ERROR, logger="pipeline.scheduler"):
        for message in messages[:50]:
            session._handle(message, now)
        for step in range(10):
            session._release(now + step * 10_000)
            session._unpark(now + step * 10_000)
            session._commit()
    progress = session.progress[SOURCE]
    assert session._consumer.paused == {SOURCE}  # type: ignore[union-attr]
    assert progress.position == record.watermark
    assert len(progress.parked) == 50
    assert written(session, session.names.scheduler_state) == []
    [error] = caplog.records
    assert "pipeline.deferred [0]" in error.getMessage()
    needed = error.args[-1]  # type: ignore[index]
    # At the message.max.bytes it names, a leader routes the partition again.
    raised = Settings(bootstrap_servers="localhost:1", kafka={"message.max.bytes": str(needed)})
    other = LeaderSession(raised, SchedulerMetrics(), [])
    try:
        assert not other.new_progress(SOURCE, record.watermark, record).full
    finally:
        other.close()
