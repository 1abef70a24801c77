"""The worker's moves go through the library's transaction loop: aborts write them again,
a fenced producer stops the worker with the library's error (librdkafka's error classes are
those of tests/unit/test_transactions.py)."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from pipeline import Job, JobCodec, Settings
from pipeline._errors import TransactionFencedError
from pipeline._job import now_ms
from pipeline._topics import TopicNames
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.commit import moves
from pipeline_worker.commit.moves import Mover
from pipeline_worker.route.outcome import OutcomeKind
from pipeline_worker.route.policy import Failure, FailurePolicy, Record
from pipeline_worker.route.router import FailureRouter

from ..test_transactions import (
    FakeProducer,
    OutageProducer,
    abortable,
    fenced,
    refused,
    retriable,
)

WHERE = ("acme.jobs.default", 0)
OTHER = ("acme.jobs.default", 1)
META = object()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def mover_on(producer: FakeProducer, loop: asyncio.AbstractEventLoop) -> Mover:
    return Mover(Settings(namespace="acme"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]


def submit(
    mover: Mover,
    where: tuple[str, int],
    offset: int,
    done: list[int],
    refused: list[int] | None = None,
) -> None:
    """Submit a move of ``offset``; once resolved, it lands in ``done`` (written) or in
    ``refused`` (given up)."""
    record = Record("acme.dlq", f"{where[1]}@{offset}".encode(), None)
    mover.submit(where, offset, [record], functools.partial(_done, done, refused, offset))


def _done(done: list[int], refused: list[int] | None, offset: int, ok: bool) -> None:
    if ok:
        done.append(offset)
    elif refused is not None:
        refused.append(offset)


def _run_ready(loop: asyncio.AbstractEventLoop) -> None:
    loop.call_soon(loop.stop)
    loop.run_forever()


def owned(where: tuple[str, int]) -> bool:
    return True


def offsets(*wheres: tuple[str, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p, 10) for t, p in wheres]


def test_moves_commit_with_the_offsets_in_one_transaction(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    done: list[int] = []
    submit(mover, WHERE, 3, done)
    assert mover.drain(owned, lambda w: 0)
    _run_ready(loop)
    assert done == [3]
    assert mover.open
    assert mover.commit(offsets(WHERE), META, owned)
    assert not mover.open
    assert producer.committed == [[("acme.dlq", b"0@3")]]
    assert producer.sent_offsets == [(offsets(WHERE), META)]


def test_a_rebalance_at_commit_writes_the_moves_again_and_commits_them_once(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = FakeProducer().failing("commit_transaction", abortable())
    mover = mover_on(producer, loop)
    submit(mover, WHERE, 3, [])
    submit(mover, OTHER, 5, [])
    mover.drain(owned, lambda w: 0)
    assert not mover.commit(offsets(WHERE, OTHER), META, owned)  # poll, then commit again
    assert "abort_transaction" in producer.calls
    assert mover.open
    assert mover.commit(offsets(WHERE, OTHER), META, owned)
    assert producer.committed == [[("acme.dlq", b"0@3"), ("acme.dlq", b"1@5")]]


@pytest.mark.parametrize("error", ["refused", "retriable"])
def test_a_commit_the_loop_gave_up_on_writes_the_moves_again_and_commits_them_once(
    loop: asyncio.AbstractEventLoop, error: str
) -> None:
    """A step Kafka refused, or one whose retries ran out, aborts the transaction too: the moves
    in it must be written again, not forgotten (a commit without them would pass their offsets)."""
    # One refusal, or as many retriable errors as the loop tries before it gives up (an abort
    # that works after them: Kafka answers again, and aborted the commit it did not confirm).
    raised = [refused()] if error == "refused" else [retriable() for _ in range(moves.ATTEMPTS)]
    producer = FakeProducer().failing("commit_transaction", *raised)
    mover = mover_on(producer, loop)
    mover._txn._sleep = lambda seconds: None
    submit(mover, WHERE, 3, [])
    mover.drain(owned, lambda w: 0)
    assert not mover.commit(offsets(WHERE), META, owned)
    assert mover.open
    assert mover.touched() == [WHERE]
    assert mover.commit(offsets(WHERE), META, owned)
    assert producer.committed == [[("acme.dlq", b"0@3")]]


def test_an_abort_while_writing_a_move_writes_the_open_ones_and_it_again(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    done: list[int] = []
    submit(mover, WHERE, 3, done)
    mover.drain(owned, lambda w: 0)
    producer.failing("produce", abortable())
    submit(mover, WHERE, 4, done)
    mover.drain(owned, lambda w: 0)
    _run_ready(loop)
    assert done == [3, 4]
    assert mover.commit(offsets(WHERE), META, owned)
    assert producer.committed == [[("acme.dlq", b"0@3"), ("acme.dlq", b"0@4")]]


def test_a_lost_partition_s_moves_are_taken_out_of_the_open_transaction(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    submit(mover, WHERE, 3, [])
    submit(mover, OTHER, 5, [])
    mover.drain(owned, lambda w: 0)
    mover.forget([OTHER])
    assert mover.touched() == [WHERE]
    assert mover.commit(offsets(WHERE), META, owned)
    assert producer.committed == [[("acme.dlq", b"0@3")]]


def test_moves_queued_for_a_partition_given_up_are_not_written_when_it_comes_back(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # A move submitted for the assignment that ends, not drained before the partition was given
    # up: drained after the same worker got the partition again, it would go into the new
    # assignment, which runs the job again and moves it a second time.
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    done: list[int] = []
    refused: list[int] = []
    submit(mover, WHERE, 3, done, refused)
    submit(mover, OTHER, 5, done, refused)
    mover.forget([WHERE])
    assert mover.drain(owned, lambda w: 0)  # WHERE is owned again
    _run_ready(loop)
    assert (done, refused) == ([5], [3])
    assert mover.commit(offsets(OTHER), META, owned)
    assert producer.committed == [[("acme.dlq", b"1@5")]]


def renewing_mover(loop: asyncio.AbstractEventLoop, *producers: FakeProducer) -> Mover:
    """A mover whose producer factory makes ``producers`` one after the other."""
    made = iter(producers)
    return Mover(Settings(namespace="acme"), loop, producer_factory=lambda conf: next(made))  # type: ignore[arg-type,return-value]


def test_a_producer_that_fails_for_good_is_replaced_and_the_next_commits_its_moves(
    loop: asyncio.AbstractEventLoop,
) -> None:
    first = FakeProducer().failing("commit_transaction", fenced())
    second = FakeProducer()
    mover = renewing_mover(loop, first, second)
    submit(mover, WHERE, 3, [])
    mover.drain(owned, lambda w: 0)
    assert not mover.commit(offsets(WHERE), META, owned)  # written again, by the new producer
    assert mover.commit(offsets(WHERE), META, owned)
    assert first.committed == []
    assert second.calls[:2] == ["init_transactions", "begin_transaction"]
    assert second.committed == [[("acme.dlq", b"0@3")]]
    assert second.sent_offsets == [(offsets(WHERE), META)]


def test_a_new_producer_kafka_will_not_register_stops_the_worker_saying_what_to_do(
    loop: asyncio.AbstractEventLoop,
) -> None:
    first = FakeProducer().failing("commit_transaction", fenced())
    second = FakeProducer().failing("init_transactions", fenced())
    mover = renewing_mover(loop, first, second)
    submit(mover, WHERE, 3, [])
    mover.drain(owned, lambda w: 0)
    with pytest.raises(TransactionFencedError, match="restart it"):
        mover.commit(offsets(WHERE), META, owned)
    assert first.committed == second.committed == []


CHANGELOG = TopicNames("acme").dedup


def _key_record(value: bytes | None) -> Record:
    """The changelog record of key ``K`` of job partition 0 (``None``: its tombstone)."""
    return Record(CHANGELOG, value, b"*/K", None, 0)


def test_a_waiting_move_does_not_write_a_key_s_tombstone_after_its_newer_record(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A dead letter's move waits for room above a long job; meanwhile another job claims its
    key and succeeds. The key's newer record goes out first, so the older tombstone must not
    follow it (it would free the key in the changelog for good)."""
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    mover._max_moved = 1  # one move above the commit point at most
    submit(mover, WHERE, 3, [])
    mover.submit(WHERE, 5, [Record("acme.dlq", b"letter", None), _key_record(None)], _ignore)
    mover.drain(owned, lambda w: 0)  # the job at offset 0 still runs: 5 waits
    other_key = Record(CHANGELOG, b"other", b"*/L", None, 0)
    mover.submit(WHERE, 6, [other_key, _key_record(b"held")], _ignore, move=False)
    mover.drain(owned, lambda w: 0)
    mover.drain(owned, lambda w: 6)  # the long job ended: 5 has room
    assert mover.commit(offsets(WHERE), META, owned)
    [written] = producer.committed
    assert written == [
        ("acme.dlq", b"0@3"),
        (CHANGELOG, b"other"),
        (CHANGELOG, b"held"),
        ("acme.dlq", b"letter"),
    ]
    assert not mover._waiting.holds_keys  # nothing waits: no key is held for it any more


def test_a_rewrite_keeps_the_order_of_writes_across_partitions(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The records of one key come from moves of several partitions (one per priority); an
    abort writes them again in the order they were first written, not partition by partition."""
    producer = FakeProducer().failing("commit_transaction", abortable())
    mover = mover_on(producer, loop)
    submit(mover, OTHER, 1, [])
    mover.submit(WHERE, 2, [_key_record(None)], _ignore)
    mover.submit(OTHER, 3, [_key_record(b"held")], _ignore, move=False)
    mover.drain(owned, lambda w: 0)
    assert not mover.commit(offsets(WHERE, OTHER), META, owned)
    assert mover.commit(offsets(WHERE, OTHER), META, owned)
    [written] = producer.committed
    assert written == [("acme.dlq", b"1@1"), (CHANGELOG, None), (CHANGELOG, b"held")]


def _ignore(done: bool) -> None:
    """A move's outcome the test does not follow."""


class AppendedMeanwhile(deque):  # type: ignore[type-arg]
    """The moves' queue, with the loop thread submitting one more move while the consumer
    thread takes the queue apart (as it may: the two threads share it)."""

    def __init__(self, late: Callable[[], None]) -> None:
        super().__init__()
        self._late: Callable[[], None] | None = late

    def popleft(self) -> Any:
        late, self._late = self._late, None
        if late is not None:
            late()
        return super().popleft()


def test_forgetting_a_partition_keeps_the_order_of_the_moves_left(
    loop: asyncio.AbstractEventLoop,
) -> None:
    # Two moves of one partition may settle one idempotency key: the later must stay later.
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    done: list[int] = []
    mover._queue = AppendedMeanwhile(lambda: submit(mover, OTHER, 9, done))
    for offset in (3, 4):
        submit(mover, OTHER, offset, done)
    submit(mover, WHERE, 5, done)
    mover.forget([WHERE])
    assert mover.drain(owned, lambda w: 0)
    _run_ready(loop)
    assert done == [3, 4, 9]


def _two_counted_moves(mover: Mover) -> list[int]:
    """Moves of offset 3 of WHERE and 5 of OTHER, written; the offsets counted so far."""
    counted: list[int] = []
    for where, offset in ((WHERE, 3), (OTHER, 5)):
        record = Record("acme.dlq", f"{offset}".encode(), None)
        mover.submit(
            where, offset, [record], _ignore, count=functools.partial(counted.append, offset)
        )
    mover.drain(owned, lambda w: 0)
    return counted


def test_a_move_is_counted_once_its_transaction_commits_and_not_when_it_is_dropped(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = FakeProducer().failing("commit_transaction", abortable())
    mover = mover_on(producer, loop)
    counted = _two_counted_moves(mover)
    assert counted == []  # in the open transaction only
    assert not mover.commit(offsets(WHERE, OTHER), META, owned)  # aborted: written again
    assert counted == []
    mover.forget([OTHER])  # lost: its new owner runs the job again
    assert mover.commit(offsets(WHERE), META, owned)
    assert counted == [3]


@pytest.mark.parametrize("deferred", [False, True])
def test_retries_dead_letters_and_deferrals_are_counted_when_committed(
    loop: asyncio.AbstractEventLoop, deferred: bool
) -> None:
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    metrics = WorkerMetrics()
    router = FailureRouter(
        FailurePolicy("acme", [5.0], codec=JobCodec(), worker="w", events=False), mover, metrics
    )
    job = Job(id="j", type="t", payload=b"{}", not_before=now_ms() + 3_600_000)
    if deferred:  # read from a priority topic an hour early: moved unchanged
        router.defer(WHERE[0], WHERE[1], 3, job, None, _ignore)
    else:
        failure = Failure(OutcomeKind.UNKNOWN_TYPE, *WHERE, 3, None, job, None, None)
        router.route(failure, _ignore)
    mover.drain(owned, lambda w: 0)
    assert (metrics.retries, metrics.dead_letters) == ({}, {})
    assert mover.commit(offsets(WHERE), META, owned)
    if deferred:
        assert (metrics.retries, metrics.dead_letters) == ({("t", "deferred"): 1}, {})
    else:  # no handler takes type t
        assert (metrics.retries, metrics.dead_letters) == ({}, {("?", "unknown_type"): 1})


def test_a_move_of_a_partition_lost_while_its_commit_was_unconfirmed_counts_if_it_committed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = OutageProducer()
    mover = mover_on(producer, loop)
    counted = _two_counted_moves(mover)
    producer.down = frozenset({"commit_transaction"})
    assert not mover.commit(offsets(WHERE, OTHER), META, owned)  # sent, not confirmed
    mover.forget([OTHER])  # lost meanwhile: what that commit holds goes with it, or not
    producer.down = frozenset()
    mover.commit(offsets(WHERE), META, lambda where: where != OTHER)  # Kafka: it committed
    assert [value for txn in producer.committed for _, value in txn] == [b"3", b"5"]
    assert sorted(counted) == [3, 5]


HIGH = ("acme.jobs.high", 0)
"""Partition 0 of another priority topic: its key records go to changelog partition 0 too."""


@pytest.mark.parametrize("first", ["newer", "older"])
def test_key_records_of_moves_waiting_on_two_priorities_reach_the_changelog_in_order(
    loop: asyncio.AbstractEventLoop, first: str
) -> None:
    """A dead letter's move on HIGH, with the tombstone of key K, and a retry's move on WHERE,
    with K's newer record (another job claimed K since), each wait for room above a long job.
    Whichever partition has room first, the changelog must end with the newer record: the
    tombstone written last freed K in the changelog while its job waited to retry."""
    producer = FakeProducer()
    mover = mover_on(producer, loop)
    mover._max_moved = 1
    mover.restore_moved(HIGH, [1])
    mover.restore_moved(WHERE, [1])
    point = {HIGH: 0, WHERE: 0}  # a long job at offset 0 of each
    letter = [Record("acme.dlq", b"letter", b"K", None), _key_record(None)]
    mover.submit(HIGH, 5, letter, _ignore)
    mover.drain(owned, point.__getitem__)
    mover.submit(
        WHERE, 7, [Record("acme.retry.0", b"retry", b"K", None), _key_record(b"B")], _ignore
    )
    mover.drain(owned, point.__getitem__)
    assert not producer.produced  # both wait
    for where in (WHERE, HIGH) if first == "newer" else (HIGH, WHERE):
        point[where] = 100  # its long job ended
        mover.drain(owned, point.__getitem__)
    changelog = [value for topic, value, *_ in producer.produced if topic == CHANGELOG]
    assert changelog[-1] == b"B"
    assert changelog == ([b"B"] if first == "newer" else [None, b"B"])
    assert not mover._waiting
    assert not mover._waiting.holds_keys
