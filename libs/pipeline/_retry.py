"""How a failed job comes back: the ``Retry`` request a handler raises, and backoff policies.

A handler raises :class:`Retry` to ask for another run at a time it chooses; any other
exception that is not fatal for its job type is retried after :meth:`Backoff.delay_s`. Both count
as an attempt: a job runs at most ``max_attempts`` times in all, then it is dead-lettered.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from ._errors import ConfigurationError, PipelineError
from ._job import MAX_DELAY_S, delay_s, due_at_ms


class Retry(PipelineError):  # noqa: N818 (the name users raise: `raise Retry(after=30)`)
    """Raise from a handler to run the job again later.

    ``Retry(after=30)`` (seconds, or a ``timedelta``) or ``Retry(at=datetime)`` (time zone
    aware); with neither, the job type's backoff decides. The retry counts as an attempt.
    """

    def __init__(
        self,
        message: str = "",
        *,
        after: float | timedelta | None = None,
        at: datetime | None = None,
    ) -> None:
        if after is not None and at is not None:
            raise ConfigurationError("Retry takes after= or at=, not both")
        if isinstance(after, timedelta):
            after = after.total_seconds()
        if after is not None and (isinstance(after, bool) or not isinstance(after, float | int)):
            raise ConfigurationError(
                f"Retry(after=...) takes seconds or a timedelta, got {after!r}"
            )
        if at is not None and not isinstance(at, datetime):
            raise ConfigurationError(f"Retry(at=...) takes a datetime, got {at!r}")
        if after is not None:
            try:
                # A wait computed as ``deadline - now`` may come out just below 0: it means now,
                # as an ``at=`` in the past does (not an error, which would make the job fail).
                after = delay_s(0.0 if after < 0 else float(after), "Retry(after=...)")
            except ValueError as exc:
                raise ConfigurationError(str(exc)) from None
        if at is not None and at.tzinfo is None:
            raise ConfigurationError("Retry(at=...) needs a time zone aware datetime")
        super().__init__(message or _describe(after, at))
        self.after_s = after
        self.at = at

    def due_ms(self, now_ms: int) -> int | None:
        """When the job should run again, or None to let the backoff policy decide."""
        if self.at is not None:
            return due_at_ms(self.at)
        if self.after_s is not None:
            return now_ms + math.ceil(self.after_s * 1000)
        return None


def _describe(after: float | None, at: datetime | None) -> str:
    if at is not None:
        return f"retry requested at {at.isoformat()}"
    if after is not None:
        return f"retry requested in {after:g}s"
    return "retry requested"


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with proportional jitter: ``base * factor**(n-1)``, at most ``cap``.

    ``jitter`` spreads each delay uniformly over ``±jitter`` of itself, so jobs that failed
    together do not come back together; where that span passes ``cap``, over its part below
    ``cap`` (a delay is never above ``cap``). ``n`` is the attempt that just failed (from 1).
    """

    base_s: float = 5.0
    factor: float = 4.0
    cap_s: float = 3600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        for name, seconds in (("base_s", self.base_s), ("cap_s", self.cap_s)):
            if not 0 < seconds <= MAX_DELAY_S:  # NaN fails too
                raise ConfigurationError(
                    f"backoff {name} must be positive and at most {MAX_DELAY_S:g}, got {seconds}"
                )
        if not 1 <= self.factor < math.inf:  # NaN fails too
            raise ConfigurationError(f"backoff factor must be at least 1, got {self.factor}")
        if not 0 <= self.jitter < 1:
            raise ConfigurationError(f"backoff jitter must be in [0, 1), got {self.jitter}")

    def delay_s(self, failed_attempt: int, rand: random.Random | None = None) -> float:
        """Seconds to wait before the attempt after ``failed_attempt``."""
        exponent = max(0, failed_attempt - 1)
        try:
            # A float power: an int one of a late attempt (the envelope may say any) takes ages.
            delay = min(self.cap_s, self.base_s * float(self.factor) ** exponent)
        except OverflowError:
            delay = self.cap_s
        if not self.jitter:
            return delay
        spread = (rand or random).uniform(-self.jitter, self.jitter)
        low, high = delay * (1.0 - self.jitter), delay * (1.0 + self.jitter)
        if high <= self.cap_s:
            return delay * (1.0 + spread)
        # The span passes the cap: the same draw, spread uniformly over its part below the cap
        # (clamping instead would bring half the jobs at the cap back at one time).
        share = (spread + self.jitter) / (2.0 * self.jitter)
        return min(self.cap_s, low + share * (self.cap_s - low))
