"""A clock that moves only when told: the stub worker's time, and ``run_job``'s if given."""

from __future__ import annotations

import math

from .._errors import ConfigurationError

START_MS = 1_767_225_600_000
"""Where a :class:`FakeClock` starts unless told: 2026-01-01T00:00:00Z, in epoch ms."""


class FakeClock:
    """Epoch milliseconds that stand still until :meth:`advance` or :meth:`advance_to_ms`.

    It never goes back: the due times of delayed and retried jobs are read on it.
    """

    __slots__ = ("_now_ms",)

    def __init__(self, start_ms: int = START_MS) -> None:
        self._now_ms = start_ms

    def __repr__(self) -> str:
        return f"FakeClock(now_ms={self._now_ms})"

    def now_ms(self) -> int:
        """The current time, in milliseconds since the Unix epoch."""
        return self._now_ms

    def advance(self, seconds: float) -> int:
        """Move ``seconds`` ahead (rounded up to a millisecond); return the new time."""
        if seconds < 0:
            raise ConfigurationError(f"a FakeClock never goes back; advance({seconds:g}) refused")
        self._now_ms += math.ceil(seconds * 1000)
        return self._now_ms

    def advance_to_ms(self, ms: int) -> int:
        """Move to epoch ``ms`` (a time already passed leaves the clock where it is)."""
        self._now_ms = max(self._now_ms, ms)
        return self._now_ms
