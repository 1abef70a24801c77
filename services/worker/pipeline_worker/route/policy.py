"""What happens to a job that did not succeed: retried later, or dead-lettered. Pure.

:class:`FailurePolicy` turns one failed message into a :class:`Move`: the records to write (the
job with one more attempt and its error appended, to a retry tier or ``<ns>.deferred``; or a
dead letter) and what to count. The worker writes a move in a Kafka transaction together with the
consumed offset (:mod:`..commit.moves`), so the decision here is made once per failure, never twice.

The classification (``Retry`` asks for a time; fatal errors, payloads that do not fit the handler
and unknown job types are dead-lettered at once; anything else is retried with the type's backoff
until ``max_attempts`` runs were made) is the library's, :func:`pipeline._failures.judge_failure`,
which ``pipeline.testing`` uses too; this module adds what only a worker has: undecodable
messages and poison pills, retry tiers, dead-letter and event records.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NamedTuple

from pipeline import Job
from pipeline._codec import DeadLetterCodec, EventCodec, JobCodec
from pipeline._failures import (
    describe_error,
    failed_job,
    judge_failure,
    qualified_name,
    traceback_text,
    with_attempt_error,
)
from pipeline._letters import keyed_within, letter_key
from pipeline._producer import LIBRDKAFKA_MESSAGE_MAX_BYTES, fits_in_message
from pipeline._records import DeadLetter, DeadLetterReason, Event, EventKind, stored_headers
from pipeline._topics import TopicNames

from .fit import lean_job, lean_letter, without_job
from .outcome import OutcomeKind

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline import JobType

Headers = list[tuple[str, str | bytes | None]] | None
DEFERRED = -1


class Record(NamedTuple):
    """One message to write as part of a move (``value`` None: a tombstone).

    A named tuple, not a frozen dataclass: one is made for every keyed job, and a tuple is made
    in a third of the time. Its fields are in the order :meth:`pipeline._transactions.
    Transactions.produce_all` takes."""

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
        max_bytes: int = LIBRDKAFKA_MESSAGE_MAX_BYTES,
    ) -> None:
        self.names = TopicNames(namespace)
        self._max_bytes = max_bytes
        """What one record may hold (``message.max.bytes``): see :mod:`.fit`."""
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
            dead = (
                None if job is None else with_attempt_error(job, error, False, now_ms, self._worker)
            )
            return self._dead(failure, dead, DeadLetterReason.POISON_PILL, now_ms)
        if job is None or failure.kind is OutcomeKind.UNDECODABLE:
            return self._dead(failure, None, DeadLetterReason.DECODE_ERROR, now_ms)
        job_type = None if failure.kind is OutcomeKind.UNKNOWN_TYPE else failure.job_type
        verdict = judge_failure(job, job_type, error, now_ms, self._rand)
        moved = failed_job(job, verdict, error, now_ms, self._worker)
        if verdict.reason is not None:
            return self._dead(failure, moved, verdict.reason, now_ms)
        tier = self.tier_for(verdict.due_ms - now_ms)
        topic = self.names.deferred if tier == DEFERRED else self.names.retry(tier)
        value = self._codec.encode(moved)
        headers = failure.raw_headers
        if not self._fits(value, failure.key, headers):
            moved = lean_job(moved)
            value = self._codec.encode(moved)
            if headers and not self._fits(value, failure.key, headers):
                headers = None  # the job matters more than its message's headers
            if not self._fits(value, failure.key, headers):
                return self._dead(failure, moved, DeadLetterReason.TOO_LARGE, now_ms)
        records = [Record(topic, value, failure.key, headers)]
        self._event(records, moved, EventKind.RETRIED, failure, describe_error(error), now_ms)
        route = "deferred" if tier == DEFERRED else f"retry.{tier}"
        return Move(records, False, route, job.type)

    def defer(self, job: Job, key: bytes | None, headers: Headers = None) -> Move:
        """The move of a job found on a priority topic long before its ``not_before``: to
        ``<ns>.deferred`` unchanged (no attempt counted), for the scheduler to release; with
        the message's ``headers`` when they fit in what the producer sends (the job matters
        more: without them, as the job alone fits or not)."""
        value = self._codec.encode(job)
        if headers and not self._fits(value, key, headers):
            headers = None
        records = [Record(self.names.deferred, value, key, headers)]
        return Move(records, False, "deferred", job.type)

    def _fits(self, value: bytes, key: bytes | None, headers: Headers) -> bool:
        """Whether a record of ``value``, ``key`` and ``headers`` is one the producer sends."""
        size = sum(len(name) + len(data or b"") for name, data in headers or ())
        return fits_in_message(self._max_bytes, value, key, size)

    # -- building ------------------------------------------------------------------------------

    def _dead(self, failure: Failure, job: Job | None, reason: str, now_ms: int) -> Move:
        error = failure.error
        letter = DeadLetter(
            reason=reason,
            message=describe_error(error) if error is not None else reason,
            error_class=qualified_name(error) if error is not None else None,
            source_topic=failure.topic,
            source_partition=failure.partition,
            source_offset=failure.offset,
            job=job,
            raw_value=failure.raw if job is None else None,
            raw_key=failure.key,
            raw_headers=stored_headers(failure.raw_headers),  # a replay sends them again
            dead_at=now_ms,
            traceback=traceback_text(error),
        )
        key = letter_key(failure.key, self._max_bytes)
        records = [Record(self.names.dlq, self._fitted(letter, failure.key), key)]
        if job is not None:
            self._event(records, job, EventKind.DEAD, failure, letter.message, now_ms)
        # The metric's label: a type the application registers, else "?" (the type named by
        # a message no handler knows is anyone's string: as a label it would grow for ever).
        known = job is not None and reason is not DeadLetterReason.UNKNOWN_TYPE
        return Move(records, True, reason, job.type if known and job is not None else "?")

    def _fitted(self, letter: DeadLetter, key: bytes | None) -> bytes:
        """``letter`` encoded, made smaller if it does not fit in one message (:mod:`.fit`),
        keyed by :func:`letter_key` of ``key``."""
        sent_key = letter_key(key, self._max_bytes)
        value = self._dlq.encode(letter)
        if fits_in_message(self._max_bytes, value, sent_key):
            return value
        lean = lean_letter(letter)
        value = self._dlq.encode(lean)
        if fits_in_message(self._max_bytes, value, sent_key):
            return value
        if lean.raw_headers:  # the job (or raw bytes) matters more than the headers
            value = self._dlq.encode(replace(lean, raw_headers={}))
            if fits_in_message(self._max_bytes, value, sent_key):
                return value
        job = letter.job
        size = len(self._codec.encode(job)) if job is not None else len(letter.raw_value or b"")
        lean = without_job(lean, size, self._max_bytes)
        return keyed_within(self._dlq, lean, key, self._max_bytes)

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
        value, key = self._events.encode(event), job.id.encode()
        # Best effort: an event too large for one message (a job id of hundreds of kilobytes,
        # which another producer may write) is left out. Kafka would refuse the whole move,
        # and every worker that took the partition would fail on it again.
        if fits_in_message(self._max_bytes, value, key):
            records.append(Record(self.names.events, value, key))
