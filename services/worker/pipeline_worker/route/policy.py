"""What happens to a job that did not succeed: retried later, or dead-lettered. Pure.

:class:`FailurePolicy` turns one failed message into a :class:`Move`: the records to write (the
job with one more attempt and its error appended, to a retry tier or ``<ns>.deferred``; or a
dead letter) and what to count. The worker writes a move in a Kafka transaction together with the
consumed offset (:mod:`..commit.moves`), so the decision here is made once per failure, never twice.

Classification (DESIGN section 6): ``Retry`` asks for a time; an error declared fatal for the job
type, a payload that does not fit the handler, an undecodable message or an unknown job type go
straight to the dead-letter topic; anything else is transient and retried with the type's backoff
until ``max_attempts`` runs were made.
"""

from __future__ import annotations

import hashlib
import math
import random
import traceback
from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from pipeline import (
    AttemptError,
    DecodeError,
    Job,
    PayloadValidationError,
    Retry,
    TimeLimitError,
    UnknownJobTypeError,
)
from pipeline._codec import DeadLetterCodec, EventCodec, JobCodec
from pipeline._records import DeadLetter, DeadLetterReason, Event, EventKind
from pipeline._topics import TopicNames

from .outcome import OutcomeKind

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline import JobType

Headers = list[tuple[str, str | bytes | None]] | None
MESSAGE_MAX = 2000
"""Error messages longer than this are cut (they travel with every retry of the job)."""
TRACEBACK_MAX = 8192
"""A dead letter keeps at most this many bytes (UTF-8) of its last error's traceback: the tail,
where the frame that raised and the error are."""
_CUT = "...\n"
DEFERRED = -1


@dataclass(frozen=True, slots=True)
class Record:
    """One message to write as part of a move (``value`` None: a tombstone)."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers = None
    partition: int | None = None
    """None: the partitioner picks it from the key."""


@dataclass(slots=True)
class Move:
    """Where a failed message goes, as the records to write in one transaction."""

    records: list[Record]
    dead: bool
    """True: dead-lettered; False: retried."""
    reason: str
    """The dead-letter reason, or the retry route (``retry.<n>`` / ``deferred``)."""
    job_type: str


@dataclass(frozen=True, slots=True)
class Failure:
    """A message that did not succeed, as the worker saw it."""

    kind: OutcomeKind
    topic: str
    partition: int
    offset: int
    key: bytes | None
    job: Job | None
    job_type: JobType | None
    error: BaseException | None
    duration_s: float = 0.0
    raw: bytes | None = None
    raw_headers: Headers = None


class FailurePolicy:
    """Decides and encodes moves for one worker process."""

    def __init__(
        self,
        namespace: str,
        retry_delays_s: Sequence[float],
        *,
        codec: JobCodec,
        worker: str,
        events: bool,
        rand: random.Random | None = None,
    ) -> None:
        self.names = TopicNames(namespace)
        self._tiers_ms = [int(d * 1000) for d in retry_delays_s]
        self._codec = codec
        self._dlq = DeadLetterCodec(codec.store)
        self._events = EventCodec(codec.store) if events else None
        self._worker = worker
        self._rand = rand or random.Random()

    # -- routing -------------------------------------------------------------------------------

    def tier_for(self, delay_ms: int) -> int:
        """The retry tier for a delay: the largest whose delay is at most ``delay_ms`` (tier 0
        for shorter ones), or ``DEFERRED`` past twice the largest tier's delay."""
        tiers = self._tiers_ms
        if not tiers or delay_ms > 2 * tiers[-1]:
            return DEFERRED
        return max(0, bisect_right(tiers, delay_ms) - 1)

    def decide(self, failure: Failure, now_ms: int) -> Move:
        """The move for ``failure``; ``now_ms`` is when it failed."""
        job = failure.job
        error = failure.error
        if failure.kind is OutcomeKind.POISON_PILL:
            dead = self._with_error(job, error, False, now_ms) if job is not None else None
            return self._dead(failure, dead, DeadLetterReason.POISON_PILL, now_ms)
        if job is None or failure.kind is OutcomeKind.UNDECODABLE:
            return self._dead(failure, None, DeadLetterReason.DECODE_ERROR, now_ms)
        if failure.kind is OutcomeKind.UNKNOWN_TYPE or isinstance(error, UnknownJobTypeError):
            return self._dead(failure, job, DeadLetterReason.UNKNOWN_TYPE, now_ms)
        job_type = failure.job_type
        fatal = job_type.options.fatal if job_type is not None else ()
        if isinstance(error, (PayloadValidationError, DecodeError)):
            reason: str = DeadLetterReason.VALIDATION_ERROR
            retryable = False
        elif fatal and isinstance(error, fatal):
            reason, retryable = DeadLetterReason.FATAL_ERROR, False
        else:
            reason, retryable = DeadLetterReason.MAX_ATTEMPTS, True
            if isinstance(error, TimeLimitError):
                reason = DeadLetterReason.TIMEOUT
        failed = self._with_error(job, error, retryable, now_ms)
        if not retryable or job.attempt >= attempt_limit(job, job_type):
            return self._dead(failure, failed, reason, now_ms)
        due = error.due_ms(now_ms) if isinstance(error, Retry) else None
        if due is None:
            backoff = job_type.options.backoff if job_type is not None else None
            delay_s = backoff.delay_s(job.attempt, self._rand) if backoff is not None else 0.0
            due = now_ms + math.ceil(delay_s * 1000)  # never early: rounded up
        due = max(due, now_ms)
        retry = replace(failed, attempt=job.attempt + 1, not_before=due)
        tier = self.tier_for(due - now_ms)
        topic = self.names.deferred if tier == DEFERRED else self.names.retry(tier)
        records = [Record(topic, self._codec.encode(retry), failure.key, failure.raw_headers)]
        self._event(records, retry, EventKind.RETRIED, failure, _describe(error), now_ms)
        route = "deferred" if tier == DEFERRED else f"retry.{tier}"
        return Move(records, False, route, job.type)

    def defer(self, job: Job, key: bytes | None) -> Move:
        """The move of a job found on a priority topic long before its ``not_before``: to
        ``<ns>.deferred`` unchanged (no attempt counted), for the scheduler to release."""
        records = [Record(self.names.deferred, self._codec.encode(job), key)]
        return Move(records, False, "deferred", job.type)

    # -- building ------------------------------------------------------------------------------

    def _with_error(
        self, job: Job, error: BaseException | None, retryable: bool, now_ms: int
    ) -> Job:
        entry = AttemptError(
            attempt=job.attempt,
            at=now_ms,
            error_class=_qualified(error),
            message=_describe(error),
            retryable=retryable,
            traceback_digest=traceback_digest(error),
            worker=self._worker,
        )
        return replace(job, errors=[*job.errors, entry])

    def _dead(self, failure: Failure, job: Job | None, reason: str, now_ms: int) -> Move:
        error = failure.error
        letter = DeadLetter(
            reason=reason,
            message=_describe(error) if error is not None else reason,
            error_class=_qualified(error) if error is not None else None,
            source_topic=failure.topic,
            source_partition=failure.partition,
            source_offset=failure.offset,
            job=job,
            raw_value=failure.raw if job is None else None,
            raw_key=failure.key,
            raw_headers=_header_bytes(failure.raw_headers) if job is None else {},
            dead_at=now_ms,
            traceback=traceback_text(error),
        )
        records = [Record(self.names.dlq, self._dlq.encode(letter), failure.key)]
        if job is not None:
            self._event(records, job, EventKind.DEAD, failure, letter.message, now_ms)
        job_type = job.type if job is not None else "?"
        return Move(records, True, reason, job_type)

    def _event(
        self,
        records: list[Record],
        job: Job,
        kind: str,
        failure: Failure,
        detail: str,
        now_ms: int,
    ) -> None:
        if self._events is None:
            return
        event = Event(
            job_id=job.id,
            job_type=job.type,
            kind=kind,
            attempt=failure.job.attempt if failure.job is not None else job.attempt,
            priority=job.priority,
            at=now_ms,
            worker=self._worker,
            duration_ms=failure.duration_s * 1000,
            detail=detail,
        )
        records.append(Record(self.names.events, self._events.encode(event), job.id.encode()))


def attempt_limit(job: Job, job_type: JobType | None) -> int:
    """How many runs ``job`` may have in all: the smaller of its envelope's ``max_attempts``
    and its type's declared one.

    The envelope always carries a number (the schema's default is 5), so a producer that does
    not know the type's options (another language, ``pipeline enqueue`` without ``--app``)
    writes one that says nothing. Both are limits, so the stricter one holds: a job never runs
    more often than its type allows, and a producer may still ask for fewer runs.
    """
    declared = job_type.options.max_attempts if job_type is not None else None
    if declared is not None and declared < job.max_attempts:
        return declared
    return job.max_attempts


def _qualified(error: BaseException | None) -> str:
    if error is None:
        return "None"
    cls = type(error)
    return f"{cls.__module__}.{cls.__qualname__}"


def _describe(error: BaseException | None) -> str:
    if error is None:
        return ""
    text = str(error) or type(error).__name__
    return text if len(text) <= MESSAGE_MAX else text[: MESSAGE_MAX - 1] + "…"


def traceback_digest(error: BaseException | None) -> str | None:
    """12 hex digits naming where an error came from (files, functions, lines; no values), so
    that identical failures group together in ``pipeline dlq ls``."""
    if error is None or error.__traceback__ is None:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    shape = "|".join(f"{f.filename}:{f.name}:{f.lineno}" for f in frames)
    shape += f"|{_qualified(error)}"
    return hashlib.sha1(shape.encode(), usedforsecurity=False).hexdigest()[:12]


def traceback_text(error: BaseException | None, limit: int = TRACEBACK_MAX) -> str | None:
    """The traceback of ``error`` (with its causes) as text, at most ``limit`` bytes of UTF-8:
    its tail, after ``...`` and a newline when cut. None for an error that was never raised."""
    if error is None or error.__traceback__ is None:
        return None
    text = "".join(traceback.format_exception(error))
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    tail = data[len(data) - (limit - len(_CUT)) :]
    return _CUT + tail.decode("utf-8", "ignore")  # a character cut in two is dropped


def _header_bytes(headers: Headers) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, value in headers or ():
        out[name] = value.encode() if isinstance(value, str) else (value or b"")
    return out
