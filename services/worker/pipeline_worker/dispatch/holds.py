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
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from .._work import Work

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
        on_due: Callable[[Work], None],
        defer: Callable[[Work], None] | None,
        waits: Callable[[Work], bool],
        clock_ms: Callable[[], float] = lambda: time.time() * 1000.0,
    ) -> None:
        self._loop = loop
        self._on_due = on_due
        self._defer = defer
        """None: no way to move a job (no failure routing): far-ahead jobs are held too."""
        self._waits = waits
        """Whether a held job still waits (False: the worker stops or lost its partition, and
        ``on_due`` at once gives the job up)."""
        self._clock_ms = clock_ms
        self.count = 0
        """Jobs held now (taken from their buffer, not started)."""

    def take(self, work: Work, wall_ms: float) -> bool:
        """Whether ``work`` must not start at ``wall_ms``; if so it is held or deferred, and
        ``on_due`` (held) or the deferral's own callback (deferred) takes it from there."""
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
        if ahead_ms > 0 and self._waits(work):
            self._arm(work, ahead_ms)  # the monotonic timer ran ahead of the wall clock
            return
        self.count -= 1
        self._on_due(work)
