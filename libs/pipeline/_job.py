"""The job model: what a job is, independent of how it travels.

Nothing here knows about Kafka or Avro. Times are integers, milliseconds since the Unix epoch
(UTC), which is what the wire carries; the ``*_datetime`` properties convert on demand.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from ._errors import UnknownPriorityError


def now_ms() -> int:
    """Milliseconds since the Unix epoch: the wire's unit of time."""
    return time.time_ns() // 1_000_000


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def due_in_ms(seconds: float) -> int:
    """The due time ``seconds`` from now, in the wire's milliseconds, rounded up.

    A due time is a promise that the job does not start before it: cut to milliseconds, it
    must round up, never down (DESIGN: "never early").
    """
    return -(-(time.time_ns() + math.ceil(seconds * 1e9)) // 1_000_000)


MAX_DELAY_S = 1e12
"""The longest delay a job may ask for (about 31,700 years): its due time must fit the wire's
64-bit milliseconds with room to spare, and a float beyond it has lost its milliseconds."""


def delay_s(seconds: float, what: str) -> float:
    """``seconds`` if it is a delay a job can carry, else :class:`ValueError` naming ``what``
    (NaN and infinities included: they would fail later, where the job could not be moved)."""
    if seconds < 0:
        raise ValueError(f"{what} must not be negative, got {seconds:g}s")
    if not math.isfinite(seconds) or seconds > MAX_DELAY_S:
        raise ValueError(
            f"{what} must be a finite number of seconds up to {MAX_DELAY_S:g}, got {seconds}"
        )
    return seconds


def due_at_ms(moment: datetime) -> int:
    """A time zone aware ``moment`` in the wire's milliseconds, rounded up (see
    :func:`due_in_ms`); exact, where ``timestamp()`` would go through a float."""
    return -(-((moment - _EPOCH) // _MICROSECOND) // 1000)


class Priority(StrEnum):
    """The four priorities; each has its own topic (``<namespace>.jobs.<priority>``)."""

    CRITICAL = "critical"
    HIGH = "high"
    DEFAULT = "default"
    LOW = "low"

    @classmethod
    def parse(cls, value: str | Priority) -> Priority:
        """``value`` as a priority; one that names none raises :class:`UnknownPriorityError`
        (a :class:`ConfigurationError`, and a ``ValueError``) naming the four."""
        try:
            return cls(value)
        except ValueError:
            raise UnknownPriorityError(value, [p.value for p in cls]) from None


class PayloadEncoding(StrEnum):
    """How a job's payload bytes are encoded, as stated in the envelope."""

    JSON = "JSON"
    AVRO = "AVRO"


MAX_ATTEMPTS = 2**31 - 1
"""The most ``max_attempts`` a job may have: the envelope's field is an Avro int."""


@dataclass(slots=True, kw_only=True)
class AttemptError:
    """One failed attempt in a job's history."""

    attempt: int
    at: int
    error_class: str
    message: str
    retryable: bool
    traceback_digest: str | None = None
    worker: str | None = None


@dataclass(slots=True, kw_only=True)
class Job:
    """A unit of background work: a job type (the handler's name) and its encoded payload."""

    id: str
    type: str
    payload: bytes
    payload_encoding: PayloadEncoding = PayloadEncoding.JSON
    priority: Priority = Priority.DEFAULT
    attempt: int = 1
    max_attempts: int = 5
    created_at: int = field(default_factory=now_ms)
    not_before: int | None = None
    idempotency_key: str | None = None
    tenant: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    errors: list[AttemptError] = field(default_factory=list)

    @property
    def created_datetime(self) -> datetime:
        return datetime.fromtimestamp(self.created_at / 1000, tz=UTC)

    @property
    def not_before_datetime(self) -> datetime | None:
        if self.not_before is None:
            return None
        return datetime.fromtimestamp(self.not_before / 1000, tz=UTC)


class JobIdFactory:
    """Makes job ids: 32 hex digits, time-ordered, unique across processes.

    The layout is 48 bits of milliseconds, 16 bits of a per-process random prefix, and a 64-bit
    counter seeded randomly. It is several times cheaper than ``uuid.uuid4()`` on the enqueue hot
    path and sorts by creation time, which makes ids pleasant to read in logs and the DLQ.
    """

    __slots__ = ("_counter", "_head", "_head_ms", "_prefix")

    def __init__(self) -> None:
        self._reseed()
        # A forked child must not repeat its parent's ids.
        os.register_at_fork(after_in_child=self._reseed)

    def _reseed(self) -> None:
        seed = int.from_bytes(os.urandom(10), "big")
        self._prefix = seed >> 64
        self._counter = seed & 0xFFFF_FFFF_FFFF_FFFF
        self._head_ms = -1
        self._head = ""

    def __call__(self) -> str:
        return self.at(now_ms())

    def at(self, ms: int) -> str:
        """An id made at ``ms``, a clock reading the caller also uses (as ``created_at``)."""
        if ms != self._head_ms:  # the ids of a batch share their millisecond
            self._head_ms = ms
            self._head = f"{ms:012x}{self._prefix:04x}"
        self._counter = counter = (self._counter + 1) & 0xFFFF_FFFF_FFFF_FFFF
        return f"{self._head}{counter:016x}"


new_job_id = JobIdFactory()
