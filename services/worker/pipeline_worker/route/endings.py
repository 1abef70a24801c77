"""How a job ends, unless it simply succeeded with nothing to tell (the processor inlines that
case): outcome hooks, failures moved before their offsets finish, idempotency keys settled
in the same transaction as their offsets, and messages that end without running (undecodable,
of an unknown type, poison pills). Runs on the event loop thread, like the processor it serves.
"""

from __future__ import annotations

import functools
import time
from typing import TYPE_CHECKING, Any, Protocol

from pipeline import DecodeError, UnknownJobTypeError
from pipeline._dedup import KeyOutcome

from .outcome import Outcome, OutcomeKind
from .policy import Failure, Record

if TYPE_CHECKING:
    from confluent_kafka import Message

    from pipeline import Job, JobType
    from pipeline._ratelog import RateLimitedLog

    from .._metrics import WorkerMetrics
    from .._work import PartitionState, Work
    from .dedup import Deduplicator
    from .events import EventStream
    from .hooks import Hooks
    from .router import FailureRouter


class JobSlots(Protocol):
    """What the endings need of the processor that ran the jobs (the execute stage)."""

    def pump(self) -> None:
        """Start queued jobs in the slots that are free now."""

    def free_slot(self, work: Work) -> None:
        """The job's handler is over: give back its concurrency slot (and its type limit and key,
        through the dispatcher)."""

    def release(self, work: Work) -> None:
        """A job that took no slot ends: give back its type limit and key only."""

    def offset_ended(self, state: PartitionState, *, finished: bool, count: int = 1) -> None:
        """Count ``count`` offsets that ended (``finished`` False: kept unfinished by a failed
        hook, or given up with their partition)."""


class Endings:
    """The ends of the jobs of one processor (see :class:`JobSlots`)."""

    def __init__(
        self,
        slots: JobSlots,
        *,
        metrics: WorkerMetrics,
        middleware: tuple[Any, ...],
        hooks: Hooks,
        log: RateLimitedLog,
        router: FailureRouter | None,
        dedup: Deduplicator | None,
        events: EventStream | None,
    ) -> None:
        self._slots = slots
        self._metrics = metrics
        self._middleware = middleware
        self._hooks = hooks
        self._log = log
        self._router = router
        self._dedup = dedup
        self._events = events

    def finish(
        self, work: Work, kind: OutcomeKind, error: BaseException | None, duration: float
    ) -> None:
        work.finished = True
        if work.timer is not None:
            work.timer.cancel()
            work.timer = None
        stats = work.stats
        stats.duration.observe(duration)
        if kind is OutcomeKind.SUCCEEDED:
            stats.succeeded += 1
        else:
            stats.failed += 1
            if kind is OutcomeKind.TIMED_OUT:
                stats.timed_out += 1
            self._hooks.log_failure(work, kind, error)
        if self._middleware:
            outcome = Outcome(
                kind=kind,
                topic=work.state.topic,
                partition=work.state.partition,
                offset=work.offset,
                key=work.key,
                job=work.job,
                job_type=work.job_type,
                error=error,
                duration=duration,
                context=work.ctx,
            )
            if not self._hooks.outcome(outcome, lambda done: self._ended(work, kind, error, done)):
                return
        self._ended(work, kind, error, True)

    def _ended(
        self, work: Work, kind: OutcomeKind, error: BaseException | None, done: bool
    ) -> None:
        """The outcome hooks are through: a failure is moved before its offset is finished,
        the key of a job that carries one is settled in the same transaction as its offset."""
        if work.state.released:
            # Given up when its partition was revoked: moving it or settling its key now could
            # land in the partition's next assignment, which runs the job again.
            self._resolve(work, False)
            return
        router = self._router
        dedup = self._dedup if done and work.job.idempotency_key is not None else None
        if done and router is not None and kind is not OutcomeKind.SUCCEEDED:
            state = work.state
            failure = Failure(
                kind,
                state.topic,
                state.partition,
                work.offset,
                work.key,
                work.job,
                work.job_type,
                error,
                time.monotonic() - work.started,
                raw_headers=work.headers,
            )
            keys = None
            if dedup is not None:
                keys = functools.partial(self.moved_key, dedup, work)
            # Tied to this assignment: written only while it lasts (see Mover.submit).
            router.route(failure, functools.partial(self._moved, work), keys, state)
            return
        if dedup is not None and self._write_key(dedup, work, kind is OutcomeKind.SUCCEEDED):
            return
        self._resolve(work, done)

    def key_succeeded(self, work: Work) -> None:
        """A job with an idempotency key succeeded, with no middleware to tell (the processor
        counted it): its key is settled in the transaction that commits its offset."""
        assert self._dedup is not None
        if work.state.released:  # given up, as in _ended: the next assignment runs it again
            self._resolve(work, False)
            return
        if not self._write_key(self._dedup, work, True):
            self._resolve(work, True)

    def _write_key(self, dedup: Deduplicator, work: Work, succeeded: bool) -> bool:
        """Settle the key of a job that ended (succeeded, else dead) and free its slot; its
        offset finishes once the key's record is in the open transaction (the consumer thread
        writes it within a poll or so). Its partition counts it until then, as it counts a
        failed job until its move is written: a revocation waits for the record, which would
        otherwise be refused once the partition is released, and the next owner would run the
        job again. False: no record to write, nothing done."""
        records = self._settle_key(
            dedup, work, KeyOutcome.SUCCEEDED if succeeded else KeyOutcome.DEAD
        )
        if not records:
            return False
        self._slots.free_slot(work)
        dedup.write(work.state, work.offset, records, self.done_all)
        return True

    def admit(
        self,
        dedup: Deduplicator,
        state: PartitionState,
        job: Job,
        job_type: JobType,
        message_key: bytes | None,
    ) -> bool:
        """Whether a job with an idempotency key runs (False: acknowledged as a duplicate)."""
        try:
            admitted = dedup.admit(state, job, job_type, message_key)
        except Exception as exc:
            # The store failed: run the job (at least once) rather than lose it.
            self._log.warning(
                "dedup", "could not check idempotency key %r, running the job: %s",
                job.idempotency_key, exc, extra={"job_id": job.id, "job_type": job.type},
            )  # fmt: skip
            return True
        if not admitted and self._events is not None:
            self._events.deduplicated(job)
        return admitted

    def _settle_key(self, dedup: Deduplicator, work: Work, outcome: KeyOutcome) -> list[Record]:
        """The changelog records for the key of a job that ended this way."""
        try:
            return dedup.settle(work.state, work.job, work.job_type, outcome)
        except Exception as exc:
            self._log.warning(
                "dedup", "could not settle idempotency key %r: %s", work.job.idempotency_key,
                exc, extra={"job_id": work.job.id, "job_type": work.job.type},
            )  # fmt: skip
            return []

    def moved_key(self, dedup: Deduplicator, work: Work, dead: bool) -> list[Record]:
        """The records for the key of a failed job, once the router decided its move."""
        return self._settle_key(dedup, work, KeyOutcome.DEAD if dead else KeyOutcome.RETRYING)

    def _moved(self, work: Work, done: bool) -> None:
        """The move of a failed job is in the open transaction (or was given up).

        This comes after the batch that freed the job's handler was pumped, so the slot it
        frees must start the next queued job here: otherwise a queue whose slots were all
        taken by failing jobs would wait for a batch that may never come.
        """
        self._resolve(work, done)
        self._slots.pump()

    def _resolve(self, work: Work, done: bool) -> None:
        """Free the job's slot and, if ``done``, mark its offset finished."""
        self.free(work)
        self.done(work.state, work.offset, done)

    def free(self, work: Work) -> None:
        """The job's handler is over: its slot (and its key, with key ordering) is free."""
        work.state.in_flight -= 1
        self._slots.free_slot(work)

    def done(self, state: PartitionState, offset: int, done: bool) -> None:
        if done:
            state.commit_offset = state.tracker.finish(offset)  # type: ignore[assignment]
        self._slots.offset_ended(state, finished=done)

    def done_all(self, state: PartitionState, offsets: list[int], done: bool) -> None:
        """:meth:`done` for each of ``offsets`` (the keyed jobs of one write), in one call; the
        partition stops counting them (see :meth:`_write_key`)."""
        state.in_flight -= len(offsets)
        if done:
            finish = state.tracker.finish
            for offset in offsets:
                point = finish(offset)
            state.commit_offset = point  # type: ignore[assignment]
        self._slots.offset_ended(state, finished=done, count=len(offsets))

    def defer(self, work: Work) -> None:
        """Move a job far ahead of its ``not_before`` to ``<ns>.deferred`` (see
        :mod:`..dispatch.holds`); it took no slot, so only its partition count and its key (with
        key ordering) are freed."""
        assert self._router is not None
        job = work.job
        state = work.state
        dedup = self._dedup if job.idempotency_key is not None else None
        keys = functools.partial(self.moved_key, dedup, work) if dedup is not None else None
        self._log.warning(
            "deferred", "%s[%d]@%d is not due for %.1f s: moved to the deferred topic, the "
            "scheduler releases it when due (produce such jobs to the deferred topic)",
            state.topic, state.partition, work.offset,
            ((job.not_before or 0) - time.time() * 1000) / 1000,
            extra={"job_id": job.id, "job_type": job.type},
        )  # fmt: skip
        self._router.defer(state.topic, state.partition, work.offset, job, work.key,
                           functools.partial(self._deferred, work), keys, state,
                           work.headers)  # fmt: skip

    def _deferred(self, work: Work, done: bool) -> None:
        """The deferral is in the open transaction (or was given up): finish the offset."""
        work.state.in_flight -= 1
        self._slots.release(work)
        self.done(work.state, work.offset, done)
        self._slots.pump()

    def skip(
        self,
        state: PartitionState,
        msg: Message,
        kind: OutcomeKind,
        error: DecodeError | None,
        job: Any,
    ) -> None:
        """A message that is not a runnable job: count, log (rate-limited), move past it."""
        state.taken += 1
        reason = "decode_error" if kind is OutcomeKind.UNDECODABLE else "unknown_type"
        self._metrics.count(self._metrics.undecodable, reason)
        where = f"{state.topic}[{state.partition}]@{msg.offset()}"
        if error is None:
            error_obj: BaseException = UnknownJobTypeError(job.type)
            self._log.warning(
                reason,
                "skipping a job of unknown type %r at %s",
                job.type,
                where,
                extra={"job_id": job.id, "job_type": job.type},
            )
        else:
            error_obj = error
            self._log.warning(reason, "skipping an undecodable message at %s: %s", where, error)
        self.end_unrun(state, msg, kind, error_obj, job, msg.offset())  # type: ignore[arg-type]

    def end_unrun(
        self,
        state: PartitionState,
        msg: Message,
        kind: OutcomeKind,
        error: BaseException,
        job: Any,
        offset: int,
    ) -> None:
        """A message that never ran: the middleware sees its outcome, then it is dead-lettered
        (without a router: skipped past). ``state.in_flight`` counts it until then."""
        state.in_flight += 1

        def finished(done: bool) -> None:
            state.in_flight -= 1
            self.done(state, offset, done)

        def resolve(done: bool) -> None:
            if state.released:  # as in _ended: its move could land in the next assignment
                finished(False)
                return
            if done and self._router is not None:
                headers = msg.headers()
                failure = Failure(
                    kind,
                    state.topic,
                    state.partition,
                    offset,
                    msg.key(),
                    job,
                    None,
                    error,
                    raw=msg.value(),
                    raw_headers=list(headers.items() if isinstance(headers, dict) else headers)
                    if headers
                    else None,
                )
                self._router.route(failure, finished, state=state)
                return
            finished(done)

        if self._middleware:
            outcome = Outcome(
                kind=kind,
                topic=state.topic,
                partition=state.partition,
                offset=offset,
                key=msg.key(),
                job=job,
                error=error,
                raw=msg.value(),
                raw_headers=msg.headers(),  # type: ignore[arg-type]
            )
            if not self._hooks.outcome(outcome, resolve):
                return
        resolve(True)


def decode_error(exc: Exception, msg: Message) -> DecodeError:
    if isinstance(exc, DecodeError):
        return exc
    raw = msg.value()
    reason = "an empty message (tombstone)" if raw is None else f"{type(exc).__name__}: {exc}"
    error = DecodeError(f"cannot decode the message: {reason}", bytes(raw or b""))
    error.__cause__ = exc
    return error
