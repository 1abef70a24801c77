"""A scheduled commit of the moves' transaction runs on a helper thread: the consumer thread
goes on polling, and takes the outcome back before it touches the transaction again."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline import Settings
from pipeline._errors import TransactionFencedError
from pipeline_worker._work import PartitionState
from pipeline_worker.commit.flight import Flight, Outcome
from pipeline_worker.commit.moves import Mover
from pipeline_worker.intake.consumer import ConsumerThread
from pipeline_worker.route.policy import Record

from ..test_transactions import FakeProducer, abortable, fenced, retriable
from .test_worker_consumer import (
    INCREMENTAL,
    TOPIC,
    FakeConsumer,
    FakeSide,
    consumer_thread,
    flush,
    loop,
    messages,
    own,
)

__all__ = ["loop"]  # the fixture

WAIT_S = 5.0


class GatedProducer(FakeProducer):
    """``commit_transaction`` waits for :attr:`gate` (a broker taking its time), and says on
    :attr:`entered` that it was called."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.committing_thread: str | None = None

    def commit_transaction(self, timeout: float = -1, /) -> None:
        self.committing_thread = threading.current_thread().name
        self.entered.set()
        assert self.gate.wait(WAIT_S), "the test never let the commit end"
        super().commit_transaction(timeout)


def _one_move_written(
    loop: asyncio.AbstractEventLoop, producer: FakeProducer, **worker: Any
) -> tuple[ConsumerThread, FakeConsumer, Mover, PartitionState]:
    """A consumer thread with a mover (``worker``: its settings), partition 0 owned, four jobs
    handed and the move of offset 1 (b"first") in the open transaction."""
    mover = Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    thread, fake, _ = consumer_thread(loop, mover=mover, **worker)
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    [state] = own(thread, 0)
    thread._hand(messages(0, 0, 4))
    written: list[bool] = []
    mover.submit((TOPIC, 0), 1, [Record("ns.dlq", b"first", None)], written.append)
    thread._drain_moves()
    flush(loop)
    assert written == [True]
    return thread, fake, mover, state


def test_a_flight_hands_its_outcome_to_the_thread_that_lands_it() -> None:
    flight = Flight("test-flight")
    release = threading.Event()
    outcomes: list[tuple[Outcome, str]] = []
    flight.start(
        lambda: release.wait(WAIT_S),
        lambda outcome: outcomes.append((outcome, threading.current_thread().name)),
    )
    assert flight.busy
    assert not flight.land(wait=False)  # still going: nothing handed
    assert outcomes == []
    with pytest.raises(RuntimeError, match="in flight"):
        flight.start(lambda: None, lambda outcome: None)
    release.set()
    assert flight.land()
    assert outcomes == [(None, threading.current_thread().name)]
    assert not flight.busy
    error = ValueError("refused")

    def fail() -> None:
        raise error

    flight.start(fail, lambda outcome: outcomes.append((outcome, "")))
    flight.close()  # lands it first
    assert outcomes[-1] == (error, "")


def test_what_the_outcome_handler_raises_comes_out_of_land_and_the_flight_is_over() -> None:
    flight = Flight("test-flight")

    def then(outcome: Outcome) -> None:
        assert isinstance(outcome, TransactionFencedError)
        raise outcome

    def call() -> None:
        raise TransactionFencedError("fenced")

    flight.start(call, then)
    with pytest.raises(TransactionFencedError):
        flight.land()
    assert not flight.busy
    flight.close()


def test_a_scheduled_commit_of_the_transaction_does_not_hold_the_consumer_thread(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """While Kafka takes its time over the commit, the consumer thread gets its call back at
    once; the moves submitted meanwhile wait in the queue (no transaction takes records while
    one commits), and the drain after the commit ended takes its outcome back (the offsets
    are recorded as committed) and writes them into the next transaction."""
    producer = GatedProducer()
    thread, _, mover, state = _one_move_written(loop, producer)
    written: list[bool] = [True]  # the first move's
    state.taken = state.handed
    state.commit_offset = 4
    assert thread._committer.commit(thread.states.values(), time.monotonic())
    assert producer.entered.wait(WAIT_S)
    assert producer.committing_thread != threading.current_thread().name
    assert mover.committing
    assert producer.committed == []  # on its way
    assert state.committed < 4

    mover.submit((TOPIC, 0), 5, [Record("ns.dlq", b"second", None)], written.append)
    thread._drain_moves(wait=False)  # what the steady state's chores do
    thread._committer.commit(thread.states.values(), time.monotonic())  # due, not made twice
    assert [value for _, value, *_ in producer.produced] == [b"first"]
    assert len(producer.sent_offsets) == 1

    producer.gate.set()
    thread._drain_moves()  # lands the commit, then writes what waited
    flush(loop)
    assert producer.committed == [[("ns.dlq", b"first")]]
    assert state.committed == 4
    assert not mover.committing
    assert [value for _, value, *_ in producer.produced] == [b"first", b"second"]
    assert written == [True, True]
    mover.close()


def test_a_commit_that_must_not_wait_lands_the_one_in_flight_first(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A synchronous commit (a revocation, the end of a burst, shutdown) waits for the commit
    in flight and then commits what is open, in that order, on its own thread."""
    producer = GatedProducer()
    thread, fake, mover, state = _one_move_written(loop, producer)
    state.commit_offset = 2
    assert thread._committer.commit(thread.states.values(), time.monotonic())
    assert producer.entered.wait(WAIT_S)
    threading.Timer(0.05, producer.gate.set).start()
    state.commit_offset = 4
    assert thread._committer.commit(thread.states.values(), time.monotonic(), sync=True)
    assert not mover.committing
    # The one in flight landed with its offsets; nothing was left open after it, so the
    # synchronous one is a plain commit.
    assert producer.committed == [[("ns.dlq", b"first")]]
    assert [[tp.offset for tp in offsets] for offsets, _ in producer.sent_offsets] == [[2]]
    assert fake.commits == [(False, [(TOPIC, 0, 4)])]
    assert state.committed == 4
    mover.close()


def test_a_fenced_producer_is_replaced_and_the_next_commit_carries_its_moves(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The commit is made on the helper thread; its outcome, a producer that failed for good,
    comes back at the next drain, which goes on with a new producer (here the same fake)."""
    producer = FakeProducer()
    thread, _, mover, state = _one_move_written(loop, producer)
    producer.failing("commit_transaction", fenced())
    state.commit_offset = 2
    assert thread._committer.commit(thread.states.values(), time.monotonic())
    thread._drain_moves()
    assert producer.committed == []
    assert producer.calls.count("init_transactions") == 2  # the new producer registered
    assert thread._committer.commit(thread.states.values(), time.monotonic())
    mover.land()
    thread._drain_moves()
    assert producer.committed == [[("ns.dlq", b"first")]]
    assert state.committed == 2


def test_a_producer_lost_for_good_stops_the_consumer_thread_at_its_next_drain(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Fenced, and Kafka fences the new producer too as it registers."""
    producer = FakeProducer()
    thread, _, _, state = _one_move_written(loop, producer)
    producer.failing("commit_transaction", fenced()).failing("init_transactions", fenced())
    state.commit_offset = 2
    assert thread._committer.commit(thread.states.values(), time.monotonic())
    with pytest.raises(TransactionFencedError):
        thread._drain_moves()
    assert state.committed < 2
    assert producer.committed == []


def _committed_past_its_move(producer: FakeProducer, fake: FakeConsumer) -> list[int]:
    """Offsets above 1 of partition 0 committed after the first transaction's, while the move
    of offset 1 (b"first") is in no committed transaction: the job would be lost."""
    if any(("ns.dlq", b"first") in txn for txn in producer.committed):
        return []
    later = [offsets for offsets, _ in producer.sent_offsets[1:]] + fake.sent
    return [tp.offset for offsets in later for tp in offsets if tp.partition == 0 and tp.offset > 1]


def test_a_revocation_settles_an_aborted_commit_in_flight_before_its_partitions_leave(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """Kafka aborts the commit in flight, and the partition is revoked (here by the close of a
    consumer thread that failed) before a drain took the outcome back. The moves of the abort
    are written again while the partition is still in the table, and its last commit carries
    them; were it settled after the partition left, its moves would be dropped and its offset
    committed past them."""
    producer = GatedProducer()
    thread, fake, mover, state = _one_move_written(loop, producer, **INCREMENTAL)
    state.taken = state.handed
    state.commit_offset = 4
    producer.failing("commit_transaction", abortable())
    assert thread._committer.commit(thread.states.values(), time.monotonic())
    assert producer.entered.wait(WAIT_S)
    producer.gate.set()  # it ends, aborted; nothing has landed it yet
    thread.rebalance.closing = True
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    mover.close()
    assert _committed_past_its_move(producer, fake) == []
    assert [("ns.dlq", b"first")] in producer.committed  # written again, committed with it


def test_the_wait_of_a_revocation_commits_an_old_transaction_on_its_own_thread(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """While a revocation waits for its jobs, an old transaction is committed there and then
    (not in flight, which the jobs' end could leave unlanded as the partition leaves)."""
    producer = SignallingProducer()
    thread, fake, mover, state = _one_move_written(loop, producer, **INCREMENTAL)
    state.taken = state.handed
    state.commit_offset = 4
    _jobs_end_after_a_commit(thread, producer)
    producer.failing("commit_transaction", abortable())
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    mover.close()
    assert _committed_past_its_move(producer, fake) == []
    assert [("ns.dlq", b"first")] in producer.committed


def test_a_lost_partitions_moves_are_not_committed_while_the_loss_waits_for_its_jobs(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A lost partition is not ours: its moves leave the open transaction at once, before the
    wait for its jobs, whose commits of old transactions would otherwise carry them (its next
    owner runs the job again and moves it a second time)."""
    producer = SignallingProducer()
    thread, fake, mover, _ = _one_move_written(loop, producer, **INCREMENTAL)
    _jobs_end_after_a_commit(thread, producer)
    thread.rebalance.on_lost(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    mover.close()
    assert producer.commit_called.is_set()  # the wait committed the old transaction
    assert not any(("ns.dlq", b"first") in txn for txn in producer.committed)


def test_a_commit_that_only_confirms_an_earlier_one_lets_a_synchronous_commit_go_on(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A commit Kafka did not confirm is asked again by the next flight; once that one lands,
    nothing is open, and a synchronous commit commits its offsets at once."""
    conflict = KafkaException(KafkaError(KafkaError._CONFLICT, "commit goes on", retriable=True))
    producer = FakeProducer()
    thread, fake, mover, state = _one_move_written(loop, producer)
    state.taken = state.handed
    state.commit_offset = 4
    producer.failing("commit_transaction", retriable())
    producer.failing("abort_transaction", conflict)
    committer = thread._committer
    assert committer.commit(thread.states.values(), time.monotonic())
    thread._drain_moves()  # lands it: not confirmed, asked again by the next commit
    assert committer.commit(thread.states.values(), time.monotonic())
    assert committer.commit(thread.states.values(), time.monotonic(), sync=True)
    assert not mover.open
    assert fake.commits == [(False, [(TOPIC, 0, 4)])]


class SignallingProducer(FakeProducer):
    """Says on :attr:`commit_called` that a commit of a transaction was made (or tried)."""

    def __init__(self) -> None:
        super().__init__()
        self.commit_called = threading.Event()

    def commit_transaction(self, timeout: float = -1, /) -> None:
        try:
            super().commit_transaction(timeout)
        finally:
            self.commit_called.set()


def _jobs_end_after_a_commit(thread: ConsumerThread, producer: SignallingProducer) -> None:
    """Every transaction counts as old, so the wait of a revocation or loss commits it; the
    loop's revoke (the jobs' end) waits for that commit."""
    thread.rebalance._txn_commit_after_s = 0.0
    side = thread._side
    assert isinstance(side, FakeSide)

    async def revoke(states: list[PartitionState], *, lost: bool) -> None:
        waited = asyncio.get_running_loop().run_in_executor(
            None, producer.commit_called.wait, WAIT_S
        )
        assert await waited, "the wait never committed the old transaction"

    side.revoke = revoke  # type: ignore[method-assign]
