"""Jobs taken before their ``not_before``: held until the wall clock says they are due."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline_worker._work import Work
from pipeline_worker.dispatch.holds import HOLD_MAX_MS, Holds

from .support import Jobs, state


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
    due: list[Work] = []
    holds = Holds(
        loop,  # type: ignore[arg-type]
        on_due=due.append,
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
    holds, due = _holds(loop, clock, waits=lambda work: waiting[0])
    far = _work(60_000)
    assert holds.take(far, clock[0])
    clock[0] = 30_000.0
    waiting[0] = False  # the worker stops: the held job is given up at once, not re-armed
    loop.fire()
    assert due == [far]
    assert loop.timers == []
