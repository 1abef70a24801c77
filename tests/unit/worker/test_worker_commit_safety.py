"""No commit passes a job whose move is not written: against a fake consumer and producer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from confluent_kafka import TopicPartition

from pipeline import Settings
from pipeline._errors import TransactionError, TransactionFencedError
from pipeline_worker.commit.marks import CommitMark
from pipeline_worker.commit.moves import Mover
from pipeline_worker.route.policy import Record

from ..test_transactions import FakeProducer, abortable, fenced, refused
from .test_worker_consumer import (
    INCREMENTAL,
    TOPIC,
    commit_in_flight,
    consumer_thread,
    finish_all,
    flush,
    loop,
    messages,
    own,
)

__all__ = ["loop"]  # the fixture

FAILURES: dict[str, tuple[list[tuple[str, Callable[[], Exception]]], type[Exception]]] = {
    # Fenced: a new producer takes its place, and Kafka fences that one as it registers.
    "fenced": (
        [("commit_transaction", fenced), ("init_transactions", fenced)],
        TransactionFencedError,
    ),
    # Aborted, then writing the moves again into a new transaction fails.
    "rewrite refused": (
        [("commit_transaction", abortable), ("begin_transaction", refused)],
        TransactionError,
    ),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_transaction_lost_for_good_is_never_committed_past_by_the_closing_revocation(
    loop: asyncio.AbstractEventLoop, failure: str
) -> None:
    """A move's job counts as finished once its records are in the open transaction. If that
    transaction can never commit (the producer failed for good), the consumer thread stops,
    and closing the consumer revokes its partitions: that last commit must not pass the job,
    nor list it as moved, or the job is neither run again nor moved anywhere."""
    steps, raised = FAILURES[failure]
    producer = FakeProducer()
    mover = Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    thread, fake, _ = consumer_thread(loop, mover=mover, **INCREMENTAL)
    moving, other = own(thread, 0, 1)
    thread._hand(messages(0, 0, 4) + messages(1, 0, 2))
    written: list[bool] = []
    mover.submit((TOPIC, 0), 1, [Record("ns.dlq", b"1", None)], written.append)
    thread._drain_moves()
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    for step, error in steps:
        producer.failing(step, error())
    flush(loop)
    assert written == [True]  # the loop finishes offset 1 now
    moving.taken = moving.handed
    moving.commit_offset = 4
    other.taken = other.handed
    other.commit_offset = 2
    # A scheduled commit is made on the mover's helper thread; its outcome comes back at the
    # consumer thread's next drain of the moves, and the thread stops with it there.
    assert thread._committer.commit(thread.states.values(), time.monotonic())
    with pytest.raises(raised):
        thread._drain_moves()
    assert not mover.committing
    assert producer.committed == []
    thread.rebalance.closing = True  # what Consumer.close() calls on the way out
    partitions = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    thread.rebalance.on_revoke(fake, partitions)  # type: ignore[arg-type]
    sent = [tp for offsets in fake.sent for tp in offsets]
    assert [tp.partition for tp in sent] == [1]  # the other partition's jobs are all done
    for tp in sent:
        assert 1 not in CommitMark.decode(tp.offset, tp.metadata).moved


def test_a_revocation_marks_clean_only_the_partitions_it_hands_over(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The revoked partition's last commit goes with the open transaction, and so do the
    offsets of the partitions that still have moves in it: those stay ours, and their marks
    must go on saying that an owner runs them (a clean one would hide this worker's death
    from poison-pill detection)."""
    producer = FakeProducer()
    mover = Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    thread, fake, _ = consumer_thread(loop, mover=mover, **INCREMENTAL)
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    revoked, kept = own(thread, 0, 1)
    thread._hand(messages(0, 0, 4) + messages(1, 0, 4))
    written: list[bool] = []
    mover.submit((TOPIC, 1), 3, [Record("ns.dlq", b"3", None)], written.append)
    thread._drain_moves()
    flush(loop)
    assert written == [True]
    revoked.commit_offset = 4
    kept.commit_offset = 2  # offset 2 still runs
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    [(offsets, _)] = producer.sent_offsets
    marks = {tp.partition: CommitMark.decode(tp.offset, tp.metadata) for tp in offsets}
    assert (marks[0].offset, marks[0].dirty) == (4, False)  # handed over in good order
    assert (marks[1].offset, marks[1].moved, marks[1].dirty) == (2, (3,), True)


def test_the_final_commit_opens_no_transaction_before_the_last_asynchronous_commit_is_answered(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """As in the steady state: a scheduled commit still on its way could reach the group
    coordinator after the final transaction's offsets and put back an older mark, without the
    last moves (their jobs would be moved again by the next owner)."""
    thread, fake, producer, mover = commit_in_flight(loop)
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    committer = thread._committer
    mover.submit((TOPIC, 0), 3, [Record("ns.dlq", b"3", None)], lambda done: None)
    begun_when_answered: list[int] = []

    def poll(timeout: float) -> None:  # serves the commit's callback, as librdkafka does
        if not begun_when_answered:
            begun_when_answered.append(producer.calls.count("begin_transaction"))
            committer.on_commit(None, fake.sent[0])

    fake.poll = poll  # type: ignore[attr-defined]
    thread._final_commit()
    assert begun_when_answered == [0]
    assert producer.committed == [[("ns.dlq", b"3")]]


def test_a_revocation_inside_consume_does_not_commit_past_a_message_not_handed_yet(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """librdkafka serves a rebalance queued behind fetched messages inside ``consume()``: the
    message ``poll()`` returned just before is not handed over yet, but the consumer's position
    is past it already. The revocation's commit must stay at the commit point (offset 5), where
    the next owner runs that message; at the position (6) nobody would."""
    thread, fake, side = consumer_thread(loop, consume_batch=100, **INCREMENTAL)
    [state] = own(thread, 1)
    thread._hand(messages(1, 0, 5))  # offsets 0..4, handed and finished: the partition is idle
    finish_all(state)
    flush(loop)
    side.batches.clear()
    polled = messages(1, 5, 1)

    def poll(timeout: float) -> object:
        if polled:
            fake.positions[(TOPIC, 1)] = 6  # delivered: the position moves past it
            return polled.pop()
        thread.stop_requested = True
        return None

    def consume(count: int, timeout: float) -> list[object]:
        thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
        return []

    fake.poll = poll  # type: ignore[attr-defined]
    fake.consume = consume  # type: ignore[attr-defined]
    thread._loop()
    assert fake.commits == [(True, [(TOPIC, 1, 5)])]
    handed = [m.offset() for batch in side.batches for _, group in batch for m in group]
    assert handed == []  # not ours any more: the next owner runs it, from the commit
    # Outside a rebalance callback, an idle partition's commit is its position again.
    [kept] = own(thread, 2)
    thread._hand(messages(2, 0, 1))
    finish_all(kept)
    fake.positions[(TOPIC, 2)] = 2  # past a transaction marker
    thread._committer.commit([kept], time.monotonic(), sync=True)
    assert fake.commits[-1] == (False, [(TOPIC, 2, 2)])
