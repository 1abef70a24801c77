"""Jobs taken before their ``not_before``: held until the wall clock says they are due."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pipeline import Pipeline
from pipeline.testing import InMemoryTransport
from pipeline_worker._work import Work
from pipeline_worker.dispatch.holds import HOLD_MAX_MS, Holds

from .support import Harness, Jobs, state


class FakeLoop:
    """Keeps the timers armed instead of running them."""

    def __init__(self) -> None:
        self.timers: list[tuple[float, Callable[..., None], tuple[Any, ...]]] = []

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self.timers.append((delay, callback, args))

    def fire(self) -> float:
        delay, callback, args = self.timers.pop(0)
        callback(*args)
        return delay


def _work(not_before: int | None) -> Work:
    work = Jobs().work(state())
    work.job.not_before = not_before
    return work


def _holds(loop: FakeLoop, clock: list[float], **kwargs: Any) -> tuple[Holds, list[Work]]:
    """Holds whose due jobs start at once (or, given up, go to ``kwargs["gone"]``); returns
    them and the list of jobs started."""
    due: list[Work] = []
    holds = Holds(
        loop,  # type: ignore[arg-type]
        start=due.append,
        room=kwargs.get("room", lambda: True),
        gone=kwargs.get("gone", due.append),
        defer=kwargs.get("defer"),
        waits=kwargs.get("waits", lambda work: True),
        clock_ms=lambda: clock[0],
    )
    return holds, due


def test_a_held_job_whose_timer_fires_before_its_millisecond_waits_again() -> None:
    loop, clock = FakeLoop(), [1_000_000.0]
    holds, due = _holds(loop, clock)
    work = _work(1_000_800)
    assert holds.take(work, clock[0])
    assert holds.count == 1
    assert abs(loop.fire() - 0.8) < 0.001
    # The monotonic timer ran ahead of the wall clock: 0.3 ms early is still early.
    clock[0] = 1_000_799.7
    assert due == []
    assert len(loop.timers) == 1
    clock[0] = 1_000_800.0
    loop.fire()
    assert due == [work]
    assert holds.count == 0


def test_a_job_that_is_due_starts_now_and_one_far_ahead_is_deferred() -> None:
    loop, clock = FakeLoop(), [5_000_000.0]
    deferred: list[Work] = []
    holds, started = _holds(loop, clock, defer=deferred.append)
    assert not holds.take(_work(None), clock[0])
    assert not holds.take(_work(5_000_000), clock[0])  # due this very millisecond
    far = _work(int(clock[0] + HOLD_MAX_MS) + 1)
    assert holds.take(far, clock[0])
    assert deferred == [far]
    assert started == []
    assert loop.timers == []
    assert holds.count == 0


def test_without_a_way_to_defer_a_far_job_is_held_and_a_dropped_one_is_given_up() -> None:
    loop, clock = FakeLoop(), [0.0]
    waiting = [True]
    gone: list[Work] = []
    holds, due = _holds(loop, clock, waits=lambda work: waiting[0], gone=gone.append)
    far = _work(60_000)
    assert holds.take(far, clock[0])
    clock[0] = 30_000.0
    waiting[0] = False  # the worker stops: the held job is given up at once, not re-armed
    loop.fire()
    assert gone == [far]
    assert due == []
    assert loop.timers == []


def test_a_due_job_waits_for_a_slot_unless_it_is_at_its_partition_s_commit_point() -> None:
    """Every slot taken: a due job waits in ``ready`` (served first), but one at its
    partition's commit point starts over the concurrency, when due or once it becomes the
    commit point; dropping a partition takes its due jobs out."""
    loop, clock = FakeLoop(), [0.0]
    holds, started = _holds(loop, clock, room=lambda: False)
    jobs, partition = Jobs(), state()
    first, second, third = (jobs.work(partition) for _ in range(3))
    for work in (first, second, third):
        work.job.not_before = 10
        assert holds.take(work, clock[0])
    clock[0] = 10.0
    for _ in range(3):
        loop.fire()
    assert started == [first]  # the commit point: over the concurrency
    assert list(holds.ready) == [second, third]
    holds.start_commit_points()
    assert started == [first]  # none of them is the commit point
    partition.tracker.finish(first.offset)
    holds.start_commit_points()
    assert started == [first, second]
    assert list(holds.ready) == [third]
    assert holds.drop([state()]) == []  # another partition's
    assert holds.drop([partition]) == [third]
    assert not holds.ready


def test_a_revocation_takes_its_due_held_jobs_out_before_the_dispatcher_s_drop_pumps() -> None:
    """The dispatcher's drop frees the limit slots of the revoked partitions' jobs and pumps
    (other partitions' jobs waited for them). Its held jobs that came due while every slot was
    taken were still in the ready list then, and that pump started them, after the revocation."""

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())
        h = Harness(app, concurrency=1)
        processor = h.processor
        state = h.partition
        held = Jobs().work(state, "t")
        state.in_flight += 1  # held: due while every slot was taken, waiting for one
        processor._holds.ready.append(held)
        begun: list[Work] = []
        processor._begin = lambda work, now, wall_ms: begun.append(work)  # type: ignore[method-assign]
        drop = processor.dispatcher.drop

        def dropping(states: Any) -> list[Work]:
            dropped = drop(states)
            processor.pump()  # as its drain of the freed limits does (on_ready)
            return dropped

        processor.dispatcher.drop = dropping  # type: ignore[method-assign]
        state.active = False  # the revocation
        assert processor.drop([state]) == 1
        assert begun == []
        assert state.in_flight == 0

    asyncio.run(asyncio.wait_for(main(), 20))
