"""The worker's rate-limited log lines are the library's (one mechanism, used by both)."""

from __future__ import annotations

from pipeline._ratelog import RateLimitedLog

__all__ = ["RateLimitedLog"]
