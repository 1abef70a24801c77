"""Per-type and per-tenant limits: a concurrency cap and a fleet-wide rate limit, behind one
admission gate.

The rate limit of a job type (``JobOptions.rate_limit``, runs per second) holds across every
worker of the group. Workers do not talk to each other, so each takes the share of the rate that
matches its share of the partitions: ``rate * owned / total``, recomputed on every assignment
change. This is exact when the type's jobs are spread evenly over the partitions (unkeyed jobs
are) and approximate otherwise (a hot key concentrates jobs on one partition, whose owner then
runs them at its share only). A tenant's cap is fleet-wide too (:func:`fleet_cap_share`);
a type's cap is per worker.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Generic, Protocol, TypeVar

Waiting = TypeVar("Waiting")
"""What waits for admission (the dispatcher's ``Work``): this module needs nothing of it."""


class Waitlist(Protocol[Waiting]):
    """The jobs waiting for a limit: a deque (arrival order), or the dispatcher's list by
    priority (:mod:`.waitlists`), whose priorities hold deques or fair queues (by their
    tenants' turns, :mod:`.fair`)."""

    def __len__(self) -> int: ...

    def append(self, item: Waiting, /) -> None: ...

    def popleft(self) -> Waiting: ...


BURST_SECONDS = 0.1
"""A bucket holds at most this many seconds worth of tokens (at least one token)."""


def fleet_share(rate: float, owned: int, total: int) -> float:
    """This worker's part of a fleet-wide ``rate``: its share of the ``total`` partitions."""
    if rate < 0 or owned < 0 or total < 0:
        raise ValueError(f"negative rate or partition count: {rate}, {owned}, {total}")
    if total == 0 or owned == 0:
        return 0.0
    return rate * min(owned, total) / total


def fleet_cap_share(cap: int, owned: int, total: int) -> int:
    """This worker's part of a fleet-wide concurrency ``cap``: its share of the ``total``
    partitions, rounded down so the fleet never exceeds the cap, but at least 1 while it owns
    any (so a worker owning fewer than ``total / cap`` partitions takes one over its share: a
    cap smaller than the number of workers, or an uneven assignment, is exceeded so)."""
    if cap < 0 or owned < 0 or total < 0:
        raise ValueError(f"negative cap or partition count: {cap}, {owned}, {total}")
    if total == 0 or owned == 0:
        return 0
    return max(1, cap * min(owned, total) // total)


class TokenBucket:
    """At most ``rate`` takes per second on average, with bursts of up to ``capacity``.

    Time is given by the caller (monotonic seconds), which keeps the bucket pure and testable.
    A rate of 0 admits nothing.
    """

    __slots__ = ("_stamp", "_tokens", "capacity", "rate")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = 0.0
        self.capacity = 1.0
        self._tokens = 1.0
        self._stamp = now
        self.set_rate(rate, now)

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate; tokens earned so far at the old rate are kept (up to the capacity)."""
        if rate < 0 or math.isnan(rate):
            raise ValueError(f"rate must be >= 0, got {rate}")
        self._refill(now)
        self.rate = rate
        self.capacity = max(1.0, rate * BURST_SECONDS)
        self._tokens = min(self._tokens, self.capacity)

    def _refill(self, now: float) -> None:
        elapsed = now - self._stamp
        if elapsed > 0:
            self._tokens = min(self.capacity, self._tokens + elapsed * self.rate)
            self._stamp = now

    def try_take(self, now: float) -> bool:
        """Take one token if there is one."""
        self._refill(now)
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def delay(self, now: float) -> float:
        """Seconds until a token is available (``inf`` at rate 0)."""
        self._refill(now)
        if self._tokens >= 1.0:
            return 0.0
        if self.rate <= 0:
            return math.inf
        return (1.0 - self._tokens) / self.rate


class TypeLimit(Generic[Waiting]):
    """Admission of one job type: at most ``cap`` running, tokens from ``bucket``.

    Jobs that cannot start wait in ``waiting``, aside from the priority queues, so a capped
    type never blocks the others; the dispatcher keeps them by priority, and inside a priority
    in arrival order, or by their tenants' turns when it shares the starts among tenants.
    """

    __slots__ = (
        "bucket",
        "cap",
        "fleet_cap",
        "name",
        "rate_limit",
        "running",
        "timer",
        "waiting",
    )

    def __init__(
        self,
        name: str,
        *,
        cap: int | None,
        rate_limit: float | None,
        now: float,
        fleet_cap: bool = False,
    ) -> None:
        self.name = name
        self.cap = cap
        self.fleet_cap = cap if fleet_cap else None
        """The cap holds fleet-wide (``cap`` is then this worker's share of it)."""
        self.rate_limit = rate_limit
        self.bucket = TokenBucket(0.0, now) if rate_limit is not None else None
        self.running = 0
        self.waiting: Waitlist[Waiting] = deque()
        self.timer: object | None = None
        """The rate timer armed for the jobs waiting (the dispatcher's), or None."""

    def try_admit(self, now: float) -> bool:
        """Reserve a slot (and a token) for one job, if both are free."""
        if self.cap is not None and self.running >= self.cap:
            return False
        if self.bucket is not None and not self.bucket.try_take(now):
            return False
        self.running += 1
        return True

    def may_admit(self, now: float) -> bool:
        """Whether :meth:`try_admit` would reserve a slot now (this takes nothing)."""
        if self.cap is not None and self.running >= self.cap:
            return False
        return self.bucket is None or self.bucket.delay(now) <= 0.0

    def release(self) -> None:
        self.running -= 1

    @property
    def capped(self) -> bool:
        """Whether the concurrency cap (rather than the rate) is what holds jobs back."""
        return self.cap is not None and self.running >= self.cap

    def set_share(self, owned: int, total: int, now: float) -> None:
        """Apply this worker's share of the fleet-wide rate limit (and cap, if fleet-wide)."""
        if self.fleet_cap is not None:
            self.cap = fleet_cap_share(self.fleet_cap, owned, total)
        if self.bucket is not None and self.rate_limit is not None:
            self.bucket.set_rate(fleet_share(self.rate_limit, owned, total), now)

    @property
    def rate(self) -> float | None:
        """This worker's current rate (None: no rate limit)."""
        return self.bucket.rate if self.bucket is not None else None
