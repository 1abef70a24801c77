"""Where a delayed job goes next: released, held in memory, or parked in a wait tier. Pure.

A job due within the horizon waits in memory. A job due later goes to the largest wait tier whose
fixed delay still brings it back at least half a horizon before it is due, so that it lands in
memory ahead of time and is released to the millisecond. Settings guarantee that the smallest
tier is at most half the horizon, so every job beyond the horizon fits some tier.

A job is released ``lead_ms`` before it is due: a release becomes visible only when its
transaction commits (tens of milliseconds), and the worker holds a job until its ``not_before``,
so releasing a little early is what lets a handler start on the millisecond.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

RELEASE = -2
HOLD = -1


@dataclass(frozen=True, slots=True)
class Router:
    """Routing decisions for one horizon and one list of increasing tier delays (ms)."""

    horizon_ms: int
    tiers_ms: tuple[int, ...]
    lead_ms: int = 0

    def route(self, due_ms: int, now_ms: int) -> int:
        """``RELEASE``, ``HOLD``, or the index of the wait tier to move the job to."""
        remaining = due_ms - now_ms
        if remaining <= self.lead_ms:
            return RELEASE
        if remaining <= self.horizon_ms or not self.tiers_ms:
            return HOLD
        fits = bisect_right(self.tiers_ms, remaining - self.horizon_ms // 2)
        return fits - 1 if fits else HOLD

    def tier_due(self, tier: int, timestamp_ms: int) -> int:
        """When a message written to ``tier`` at ``timestamp_ms`` may leave it."""
        return timestamp_ms + self.tiers_ms[tier]
