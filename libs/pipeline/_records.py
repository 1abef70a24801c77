"""The records of the wire contract besides the job: dead letters, lifecycle events, schedules.

Plain dataclasses mirroring ``schemas/pipeline/*.avsc``; :mod:`pipeline._codec` turns them into
bytes. Like :class:`pipeline.Job`, times are integer milliseconds since the Unix epoch (UTC).
``reason``, ``kind`` and ``missed`` are strings on the wire (open sets, so a new value never
breaks an old reader); the ``StrEnum`` classes below name the known values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from ._job import Job, PayloadEncoding, Priority, new_job_id, now_ms


class DeadLetterReason(StrEnum):
    """Why a job was dead-lettered (known values of ``DeadLetter.reason``)."""

    DECODE_ERROR = "decode_error"
    UNKNOWN_TYPE = "unknown_type"
    VALIDATION_ERROR = "validation_error"
    FATAL_ERROR = "fatal_error"
    MAX_ATTEMPTS = "max_attempts"
    POISON_PILL = "poison_pill"
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    """Its retry, with one more attempt in its history, would not fit in one message."""


class EventKind(StrEnum):
    """What happened to a job (known values of ``Event.kind``)."""

    STARTED = "started"
    PROGRESS = "progress"
    SUCCEEDED = "succeeded"
    RETRIED = "retried"
    DEAD = "dead"
    REPLAYED = "replayed"
    DISCARDED = "discarded"
    DEDUPLICATED = "deduplicated"


class MissedFires(StrEnum):
    """What a schedule does with fires missed while no scheduler ran."""

    SKIP = "skip"
    ONCE = "once"
    ALL = "all"


@dataclass(slots=True, kw_only=True)
class DeadLetter:
    """A message on ``<ns>.dlq``: the job (or the raw bytes if undecodable), why, and whence.

    ``job_id``, ``job_type`` and ``tenant`` are taken from ``job`` when not given.
    """

    reason: str
    message: str
    source_topic: str
    source_partition: int
    source_offset: int
    job: Job | None = None
    id: str = field(default_factory=new_job_id)
    job_id: str | None = None
    job_type: str | None = None
    raw_value: bytes | None = None
    raw_key: bytes | None = None
    raw_headers: dict[str, bytes] = field(default_factory=dict)
    error_class: str | None = None
    dead_at: int = field(default_factory=now_ms)
    tenant: str | None = None
    traceback: str | None = None
    """The last error's traceback text, bounded (its tail); None if there was none."""

    def __post_init__(self) -> None:
        if self.job is not None:
            if self.job_id is None:
                self.job_id = self.job.id
            if self.job_type is None:
                self.job_type = self.job.type
            if self.tenant is None:
                self.tenant = self.job.tenant


@dataclass(slots=True, kw_only=True)
class Event:
    """A job lifecycle event on ``<ns>.events``."""

    job_id: str
    job_type: str
    kind: str
    attempt: int
    priority: str
    at: int = field(default_factory=now_ms)
    worker: str | None = None
    duration_ms: float | None = None
    progress: float | None = None
    detail: str | None = None


@dataclass(slots=True, kw_only=True)
class Schedule:
    """A cron schedule on the compacted ``<ns>.schedules`` topic, keyed by ``name``.

    ``priority`` and ``max_attempts`` of ``None`` leave them to the job type's declared options
    (where the scheduler knows the type), else to the defaults.
    """

    name: str
    cron: str
    job_type: str
    payload: bytes
    payload_encoding: PayloadEncoding = PayloadEncoding.JSON
    timezone: str = "UTC"
    priority: Priority | None = None
    max_attempts: int | None = None
    missed: str = MissedFires.SKIP
    headers: dict[str, str] = field(default_factory=dict)
    idempotency_ttl_s: float | None = None
    created_at: int = field(default_factory=now_ms)
    enabled: bool = True


def stored_headers(
    headers: Iterable[tuple[str, str | bytes | None]] | Mapping[str, str | bytes | None] | None,
) -> dict[str, bytes]:
    """A message's headers as a dead letter keeps them (``raw_headers``): bytes by name, the
    last value of a repeated name, a null value as empty bytes."""
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    return {
        name: value.encode() if isinstance(value, str) else (value or b"") for name, value in items
    }
