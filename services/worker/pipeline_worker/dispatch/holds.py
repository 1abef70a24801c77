"""Jobs taken from a buffer before their ``not_before``: never started early.

A job reaches a priority topic before it is due in two ways. The scheduler and the retry relay
release jobs a little ahead of their time (the scheduler's release lead): such a job is *held*
here on a timer, without taking a slot, and starts once its millisecond has passed. A producer
may also write a job with a ``not_before`` far ahead straight to a priority topic (the wire
format allows it): holding it would keep its offset, and every offset behind it, uncommitted
for as long, so past :data:`HOLD_MAX_MS` it is *deferred* instead: moved unchanged to
``<ns>.deferred`` in the same transaction as its offset, like a retry that fits no tier, and the
scheduler releases it when it is due.

The hold timer runs on the event loop's monotonic clock while ``not_before`` is wall-clock time;
the two can disagree by a little (timer granularity, clock slewing) or a lot (a clock step), so
when the timer fires the wall clock is asked again, and a job that is still early waits again.

A held job keeps its type's and tenant's slots (and its key) while it waits: up to the
scheduler's release lead (200 ms by default), at most :data:`HOLD_MAX_MS`. When due it starts
if a concurrency slot is free; if not, it waits in :attr:`Holds.ready`, which the processor
serves before the queues. A due job at its partition's commit point (its lowest unfinished
offset) starts even with every slot taken, at most one such job a partition over the
concurrency: the slots may all be held by failed jobs whose moves wait for that commit point to
pass (a partition keeps a bounded number of moves above it), and only that job can make it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from .._work import PartitionState, Work

HOLD_MAX_MS = 5000.0
"""A job whose ``not_before`` is at most this far ahead waits for it; a later one is deferred."""
HOLD_MARGIN_S = 0.0005
"""Added to each hold timer, so that the wall clock rarely has to be asked twice."""


class Holds:
    """Holds early jobs until due, hands far-ahead ones to ``defer`` (loop thread only)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        start: Callable[[Work], None],
        room: Callable[[], bool],
        gone: Callable[[Work], None],
        defer: Callable[[Work], None] | None,
        waits: Callable[[Work], bool],
        clock_ms: Callable[[], float] = lambda: time.time() * 1000.0,
    ) -> None:
        """``start(work)``: take a concurrency slot and run it; ``room()``: whether a slot is
        free; ``gone(work)``: a held job given up (never started: its offset stays unfinished)."""
        self._loop = loop
        self._start = start
        self._room = room
        self._gone = gone
        self._defer = defer
        """None: no way to move a job (no failure routing): far-ahead jobs are held too."""
        self._waits = waits
        """Whether a held job still waits (False: the worker stops or lost its partition, and
        the job is given up at once)."""
        self._clock_ms = clock_ms
        self.count = 0
        """Jobs held now (taken from their buffer, not started)."""
        self.ready: deque[Work] = deque()
        """Held jobs whose time came while every slot was taken: they start first."""

    def take(self, work: Work, wall_ms: float) -> bool:
        """Whether ``work`` must not start at ``wall_ms``; if so it is held (started, or put in
        :attr:`ready`, when due) or deferred (the deferral's own callback takes it from there)."""
        not_before = work.job.not_before
        if not_before is None or not_before <= wall_ms:
            return False
        ahead_ms = not_before - wall_ms
        if ahead_ms > HOLD_MAX_MS and self._defer is not None:
            self._defer(work)
            return True
        self.count += 1
        self._arm(work, ahead_ms)
        return True

    def _arm(self, work: Work, ahead_ms: float) -> None:
        self._loop.call_later(ahead_ms / 1000 + HOLD_MARGIN_S, self._due, work)

    def _due(self, work: Work) -> None:
        not_before = work.job.not_before
        assert not_before is not None
        ahead_ms = not_before - self._clock_ms()
        waits = self._waits(work)
        if ahead_ms > 0 and waits:
            self._arm(work, ahead_ms)  # the monotonic timer ran ahead of the wall clock
            return
        self.count -= 1
        if not waits:
            self._gone(work)
        elif self._room() or work.at_commit_point:
            self._start(work)
        else:
            self.ready.append(work)

    def start_commit_points(self) -> None:
        """Every concurrency slot is taken: start the due jobs at their partition's commit
        point over the concurrency (see the module docstring); the others wait on."""
        ready = self.ready
        starting = [work for work in ready if work.at_commit_point]
        if starting:
            waiting = [work for work in ready if not work.at_commit_point]
            ready.clear()
            ready.extend(waiting)
            for work in starting:
                self._start(work)

    def drop(self, states: Iterable[PartitionState]) -> list[Work]:
        """Take out of :attr:`ready` the due jobs of ``states`` (revocation, shutdown): taken
        from their buffer already, never started."""
        doomed = set(states)
        dropped = [work for work in self.ready if work.state in doomed]
        if dropped:
            kept = [work for work in self.ready if work.state not in doomed]
            self.ready.clear()
            self.ready.extend(kept)
        return dropped
