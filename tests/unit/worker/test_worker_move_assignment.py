"""A move belongs to the assignment it was made in, not just to its partition: a partition given
up while its jobs still ran (the revocation's wait over, or failed) may come back to this
worker, and that next assignment reads and runs those jobs again. A late move of the first
one written into the second would move its job twice."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from pipeline import Pipeline, Settings
from pipeline._errors import TransactionError, TransactionFencedError
from pipeline.testing import InMemoryTransport
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.commit.marks import MAX_MOVED
from pipeline_worker.commit.moves import Mover
from pipeline_worker.intake.consumer import ConsumerThread
from pipeline_worker.route.policy import FailurePolicy, Record
from pipeline_worker.route.router import FailureRouter

from ..test_transactions import FakeProducer, abortable, fenced, refused
from .support import Harness
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
from .test_worker_dedup import ChangelogStore, keyed, make

__all__ = ["loop"]  # the fixture


class Revoke:
    """The loop's revoke, waiting (its jobs do not end) until :meth:`end`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._over = asyncio.run_coroutine_threadsafe(_event(), loop).result(5)
        self._called = False
        self._ended = threading.Event()

    def __call__(self, states: object, *, lost: bool) -> Coroutine[Any, Any, None]:
        self._called = True
        return self._wait()

    async def _wait(self) -> None:
        try:
            await self._over.wait()
        finally:
            self._ended.set()

    def end(self) -> None:
        if self._called:
            self._loop.call_soon_threadsafe(self._over.set)
            assert self._ended.wait(5)


def revoking(
    loop: asyncio.AbstractEventLoop,
) -> tuple[ConsumerThread, FakeConsumer, FakeSide, FakeProducer, Mover, Revoke]:
    """A consumer thread with a mover, partition 0 owned with four jobs handed, offset 2 still
    running; the loop's revoke waits until the test ends it."""
    producer = FakeProducer()
    mover = Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    thread, fake, side = consumer_thread(loop, mover=mover, **INCREMENTAL)
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    fake.incremental_assign = lambda tps: None  # type: ignore[attr-defined]
    [state] = own(thread, 0)
    thread._hand(messages(0, 0, 4))
    state.commit_offset = 2
    revoke = Revoke(loop)
    side.revoke = revoke  # type: ignore[method-assign]
    return thread, fake, side, producer, mover, revoke


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _failing_revoke(states: object, *, lost: bool) -> None:
    raise RuntimeError("on_partitions_revoked failed")


@pytest.mark.parametrize("ending", ["deadline", "error"])
def test_a_move_of_an_assignment_given_up_is_not_written_into_the_next_one(
    loop: asyncio.AbstractEventLoop, ending: str
) -> None:
    """The revocation's wait gives up (its deadline passed: the loop is blocked; or the loop's
    revoke failed): the partition is handed over with a job still running. The group gives
    it back; the old job's move then comes, for an offset the new assignment runs again."""
    thread, fake, side, producer, mover, revoke = revoking(loop)
    [old] = thread.states.values()
    if ending == "deadline":
        thread.rebalance._grace_s = -5.0  # the deadline (grace + 5 s) is now
    else:
        side.revoke = _failing_revoke  # type: ignore[method-assign]
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    assert fake.unassigned == [(TOPIC, 0)]
    assert old.released, "handed over, yet its jobs not given up"
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    new = thread.states[(TOPIC, 0)]
    assert new is not old
    late: list[bool] = []
    again: list[bool] = []
    mover.submit((TOPIC, 0), 2, [Record("ns.dlq", b"old", None)], late.append, state=old)
    mover.submit((TOPIC, 0), 2, [Record("ns.dlq", b"new", None)], again.append, state=new)
    thread._drain_moves()
    flush(loop)
    assert late == [False]  # not done: the new assignment runs the job again...
    assert again == [True]  # ...and moves it, once
    assert [value for _, value, *_ in producer.produced] == [b"new"]
    assert mover.moved == {(TOPIC, 0): {2}}
    revoke.end()


def test_a_late_move_of_an_assignment_that_ended_does_not_wait_for_room_in_the_next_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A move with no room above its partition's commit point waits, and its job keeps its
    slot: one of an assignment that is over is refused at once (the room is the next one's)."""
    producer = FakeProducer()
    mover = Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    thread, _, _ = consumer_thread(loop, mover=mover)
    [old] = own(thread, 0)
    old.released = True  # given up with the revocation, then the partition is ours again
    [new] = own(thread, 0)
    mover.moved[(TOPIC, 0)] = set(range(100, 100 + MAX_MOVED))  # the new one's moves: full
    late: list[bool] = []
    mover.submit((TOPIC, 0), 500, [Record("ns.dlq", b"late", None)], late.append, state=old)
    thread._drain_moves()
    flush(loop)
    assert late == [False]
    assert producer.produced == []
    assert new.commit_offset == -1


FATAL: dict[str, tuple[list[tuple[str, Callable[[], Exception]]], type[Exception]]] = {
    # Fenced: a new producer takes its place, and Kafka fences that one as it registers.
    "fenced": (
        [("begin_transaction", fenced), ("init_transactions", fenced)],
        TransactionFencedError,
    ),
    # Aborted, then writing the moves again into a new transaction fails.
    "rewrite refused": (
        [("begin_transaction", abortable), ("begin_transaction", refused)],
        TransactionError,
    ),
}


@pytest.mark.parametrize("failure", list(FATAL))
def test_a_transaction_lost_for_good_during_the_revocation_s_wait_stops_the_consumer_thread(
    loop: asyncio.AbstractEventLoop, failure: str
) -> None:
    """The wait writes the moves of the jobs it waits for; a producer that failed for good
    there was logged and the revocation went on, committing with a producer that can write
    nothing more, where everywhere else the consumer thread stops (the jobs run again)."""
    steps, raised = FATAL[failure]
    thread, fake, _, producer, mover, revoke = revoking(loop)
    written: list[bool] = []
    mover.submit((TOPIC, 0), 2, [Record("ns.dlq", b"2", None)], written.append)
    for step, error in steps:
        producer.failing(step, error())
    with pytest.raises(raised):
        thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    assert fake.unassigned == []
    assert producer.committed == []
    assert fake.commits == []
    flush(loop)
    assert written == []  # never finished: its job runs again with the next owner
    revoke.end()


# -- the loop's side: moves and keys of an assignment that ended -----------------------------


async def turn() -> None:
    """Wait until the loop ran every callback queued so far (a mover's ``done`` calls)."""
    ran = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(ran.set_result, None)
    await ran


def submitted(mover: Mover) -> asyncio.Event:
    """Set each time the loop submits a move."""
    event = asyncio.Event()
    submit = mover.submit

    def submitting(*args: Any, **kwargs: Any) -> None:
        submit(*args, **kwargs)
        event.set()

    mover.submit = submitting  # type: ignore[method-assign]
    return event


def test_a_failed_job_s_move_is_not_written_once_its_assignment_ended() -> None:
    """Routed while the assignment lasted, drained after it ended with the partition ours
    again: the move goes to the mover tied to the assignment its job ran in."""

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("fails")
        def fails() -> None:
            raise RuntimeError("downstream down")

        producer = FakeProducer()
        mover = Mover(
            Settings(namespace="acme"),
            asyncio.get_running_loop(),
            producer_factory=lambda conf: producer,  # type: ignore[arg-type,return-value]
        )
        metrics = WorkerMetrics()
        policy = FailurePolicy("acme", [5.0], codec=app.codec, worker="w", events=False)
        moved = submitted(mover)
        h = Harness(app, router=FailureRouter(policy, mover, metrics))
        h.feed(h.message("fails"))
        await asyncio.wait_for(moved.wait(), 5)
        state = h.partition
        state.active = False  # the revocation...
        state.released = True  # ...gave the job up; the partition is assigned again
        mover.drain(lambda where: True, lambda where: -1)
        assert await h.processor.wait_idle([state], 5.0)
        assert producer.produced == []
        assert state.commit_offset == -1  # unfinished: the next assignment runs it again
        await h.processor.close()

    asyncio.run(asyncio.wait_for(main(), 20))


@pytest.mark.parametrize("given_up", ["before its end", "before its record is written"])
def test_a_key_of_an_assignment_that_ended_is_not_settled_into_the_next_one(
    given_up: str,
) -> None:
    """The inlined success of a job with an idempotency key writes its key's record with its
    offset: given up before the job ended, or before that record was written, neither is."""

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())
        release = threading.Event()

        @app.job("charge")
        def charge(n: int) -> None:
            release.wait(10)

        producer = FakeProducer()
        mover = Mover(
            Settings(namespace="acme"),
            asyncio.get_running_loop(),
            producer_factory=lambda conf: producer,  # type: ignore[arg-type,return-value]
        )
        records = submitted(mover)
        h = Harness(app, dedup=make(ChangelogStore(), mover, app), plain=True)  # type: ignore[arg-type]
        h.feed(keyed(h, 0, "a"))
        state = h.partition
        assert state.in_flight == 1  # running
        if given_up == "before its end":
            state.active = False
            state.released = True
        release.set()
        if given_up == "before its end":
            assert await h.processor.wait_idle([state], 5.0)
            await turn()  # the keys of a turn go to the mover at its end
            assert not records.is_set()
        else:
            await asyncio.wait_for(records.wait(), 5)
            state.active = False
            state.released = True
            mover.drain(lambda where: True, lambda where: -1)
            await turn()
        assert producer.produced == []
        assert state.commit_offset == -1
        await h.processor.close()

    asyncio.run(asyncio.wait_for(main(), 20))
