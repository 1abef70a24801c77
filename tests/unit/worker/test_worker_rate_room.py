"""A rate limit spends its tokens only on jobs that can start: with every concurrency slot taken,
its timer marks the limit due instead of admitting jobs no slot can run (which would then all
start at once when slots free, far over the bucket's burst)."""

from __future__ import annotations

import asyncio

from pipeline_worker._work import Work
from pipeline_worker.dispatch.dispatcher import Dispatcher
from pipeline_worker.dispatch.limits import TypeLimit
from pipeline_worker.dispatch.policies import WeightedPolicy

from .support import FakeTimers, Harness, Jobs, state
from .test_worker_executor import make_app, run


class Slots:
    """The processor's concurrency, as the dispatcher sees it through ``room``."""

    def __init__(self, free: int) -> None:
        self.free = free

    def room(self) -> int:
        return self.free


def setup(free: int, ready: list[int] | None = None) -> tuple[FakeTimers, Slots, Dispatcher, Jobs]:
    timers = FakeTimers()
    slots = Slots(free)
    d = Dispatcher(
        4,
        WeightedPolicy([10, 5, 3, 1]),
        key_ordering=False,
        clock=timers.clock,
        schedule=timers.schedule,
        on_ready=lambda: ready.append(1) if ready is not None else None,
        room=slots.room,
    )
    return timers, slots, d, Jobs()


def rated(rate: float, cap: int | None = None) -> TypeLimit[Work]:
    limit = TypeLimit[Work]("call_api", cap=cap, rate_limit=rate, now=0.0)
    limit.set_share(1, 1, 0.0)
    return limit


def test_a_rate_does_not_burst_after_a_spell_with_every_slot_taken() -> None:
    timers, slots, d, jobs = setup(64)
    api = rated(1.0)  # a bucket of 1 token
    p = state()
    for _ in range(100):
        d.queues[0].append(jobs.work(p, "call_api", limit=api))
    assert len(d.pop_many(64)) == 1
    slots.free = 0  # long jobs of other types take every slot for 30 s
    for _ in range(300):
        timers.advance(0.1)
    assert not d.admitted  # no token spent on jobs that could not start
    slots.free = 64
    assert len(d.pop_many(64)) == 1  # the one token saved, not 30
    # Then on at the rate: one a second.
    started = 0
    for _ in range(50):
        timers.advance(0.1)
        started += len(d.pop_many(64))
    assert started == 5


def test_a_due_limit_starts_its_job_when_a_slot_frees() -> None:
    """The timer fired while no slot was free: nothing else will wake the limit up but the pop
    that comes when a slot frees, and that pop must start its job."""
    ready: list[int] = []
    timers, slots, d, jobs = setup(3, ready)
    api = rated(1.0)
    p = state()
    for _ in range(3):
        d.queues[0].append(jobs.work(p, "call_api", limit=api))
    assert len(d.pop_many(3)) == 1  # the others wait for the rate, on a timer
    assert len(api.waiting) == 2
    assert timers.timers
    slots.free = 0
    timers.advance(1.0)  # the token is due: no slot
    assert not timers.timers  # no timer re-armed: the limit waits for a pop
    assert not d.admitted
    timers.advance(10.0)  # a long spell: nothing more is spent
    slots.free = 1
    [work] = d.pop_many(1)
    assert work.limit is api
    # The last job waits for its token on a timer again, which says so when it fires.
    slots.free = 0  # the job just started runs
    d.release(work)
    slots.free = 1
    assert timers.timers
    ready.clear()
    timers.advance(1.0)
    assert ready == [1]
    assert len(d.pop_many(1)) == 1
    assert not api.waiting


def test_a_due_limit_is_served_by_pop_too() -> None:
    timers, slots, d, jobs = setup(1)
    api = rated(1.0)
    p = state()
    for _ in range(2):
        d.queues[0].append(jobs.work(p, "call_api", limit=api))
    assert d.pop() is not None
    assert d.pop() is None  # the second waits for the rate
    slots.free = 0
    timers.advance(5.0)
    assert not d.admitted
    slots.free = 1
    work = d.pop()
    assert work is not None
    assert work.limit is api


def test_a_freed_cap_slot_with_no_room_reserves_nothing() -> None:
    """A job of a capped type ends while the other slots stay taken (its own slot taken at once
    by another job): the next job of the type keeps its token and cap slot for when it can run."""
    timers, slots, d, jobs = setup(2)
    api = rated(1000.0, cap=1)
    p = state()
    for _ in range(3):
        d.queues[0].append(jobs.work(p, "call_api", limit=api))
    [first] = d.pop_many(2)
    timers.advance(1.0)
    slots.free = 0
    d.release(first)
    assert api.running == 0
    assert not d.admitted
    slots.free = 1
    [second] = d.pop_many(1)
    assert second.limit is api
    assert api.running == 1


def test_due_limits_share_a_scarce_room_in_the_order_they_came_due() -> None:
    """One free slot at a time: the limit left out stays due and goes first next time."""
    timers, slots, d, jobs = setup(6)
    a = TypeLimit[Work]("a", cap=None, rate_limit=1.0, now=0.0)
    b = TypeLimit[Work]("b", cap=None, rate_limit=1.0, now=0.0)
    for limit in (a, b):
        limit.set_share(1, 1, 0.0)
    p = state()
    for _ in range(3):
        d.queues[0].append(jobs.work(p, "a", limit=a))
        d.queues[0].append(jobs.work(p, "b", limit=b))
    assert len(d.pop_many(6)) == 2  # the others wait for the rates
    slots.free = 0
    timers.advance(1.0)  # both due
    assert not d.admitted  # no token spent without a slot
    slots.free = 1
    [first] = d.pop_many(1)
    # The first one's timer fires (say, a slot free): it takes its turn behind the other.
    timers.advance(1.0)
    assert not d.admitted
    [second] = d.pop_many(1)
    assert {first.limit, second.limit} == {a, b}
    [third] = d.pop_many(1)
    assert third.limit is first.limit


def test_the_processor_tells_the_dispatcher_its_free_slots() -> None:
    async def main() -> None:
        app = make_app()
        started = asyncio.Event()
        go = asyncio.Event()

        @app.job("slow")
        async def slow() -> None:
            started.set()
            await go.wait()

        h = Harness(app, concurrency=3)
        room = h.processor.dispatcher._room
        assert room is not None
        assert room() == 3
        h.feed(h.message("slow"))
        await started.wait()
        assert room() == 2
        go.set()
        await h.recorder.wait_for(1)

    run(main)
