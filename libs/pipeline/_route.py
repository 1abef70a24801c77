"""How a job of one enqueue call is routed: its topic, key and the fields every job of it shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ._codec import PayloadCodec
from ._errors import ConfigurationError
from ._job import Job, Priority, due_at_ms, due_in_ms
from ._registry import JobType


@dataclass(frozen=True, slots=True)
class Route:
    """Where and how the jobs of one enqueue call go, resolved once for all of them."""

    job_type: str
    registered: JobType | None
    payload_codec: PayloadCodec
    check: Callable[[Mapping[str, Any], bytes], None] | None
    """Checks the encoded payload against the handler's annotations; None: nothing to check."""
    topic: str
    key: bytes | None
    priority: Priority
    max_attempts: int
    not_before: int | None
    idempotency_key: str | None
    tenant: str | None
    headers: dict[str, str]

    def job(self, job_id: str, payload: bytes) -> Job:
        """A new job of this route."""
        return Job(
            id=job_id,
            type=self.job_type,
            payload=payload,
            payload_encoding=self.payload_codec.encoding,
            priority=self.priority,
            max_attempts=self.max_attempts,
            not_before=self.not_before,
            idempotency_key=self.idempotency_key,
            tenant=self.tenant,
            headers=self.headers.copy() if self.headers else {},
        )


def not_before_ms(delay: float | timedelta | None, run_at: datetime | None) -> int | None:
    """The due time of ``delay`` or ``run_at`` in the wire's milliseconds; None: neither."""
    if delay is not None and run_at is not None:
        raise ConfigurationError("give either delay or run_at, not both")
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if seconds < 0:
            raise ConfigurationError(f"delay must not be negative, got {seconds:g}s")
        return due_in_ms(seconds)
    if run_at is not None:
        if run_at.tzinfo is None:
            raise ConfigurationError("run_at must be timezone-aware (e.g. datetime.now(UTC))")
        return due_at_ms(run_at)
    return None
