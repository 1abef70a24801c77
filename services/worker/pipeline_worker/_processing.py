"""The per-job path on the event loop: decode, queue, start, finish, mark the offset done.

Everything here runs on the event loop thread and is written for throughput: batches in,
plain attribute updates, no locks, no per-job logging, no per-job task or wake-up. The hot
loop is :meth:`Processor.on_batch` -> :meth:`Processor.pump` -> an executor -> :meth:`complete`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipeline import (
    DecodeError,
    JsonPayload,
    PayloadValidationError,
    Pipeline,
    Priority,
    TimeLimitError,
    UnknownJobTypeError,
)
from pipeline._context import JobContext
from pipeline._dedup import Outcome as KeyOutcome

from ._dispatch import Dispatcher, make_policy
from ._executor import AsyncRunners, Completion, ThreadPool, is_call_error
from ._failures import Failure, Record
from ._holds import Holds
from ._hooks import Hooks
from ._jobtypes import TypeTable
from ._metrics import WorkerMetrics
from ._middleware import Middleware, Outcome, OutcomeKind
from ._ratelog import RateLimitedLog
from ._work import IdleWaiters, PartitionState, Work

if TYPE_CHECKING:
    import contextvars

    from confluent_kafka import Message

    from pipeline import Job, JobType
    from pipeline._settings import WorkerSettings

    from ._events import EventStream
    from ._keys import Deduplicator
    from ._router import FailureRouter

_log = logging.getLogger("pipeline.worker.jobs")
_JSON = JsonPayload()


class Processor:
    """Jobs of the owned partitions, from a consumed batch to a finished offset."""

    def __init__(
        self,
        *,
        app: Pipeline,
        worker: WorkerSettings,
        priorities: Sequence[Priority],
        topics: Mapping[Priority, str],
        loop: asyncio.AbstractEventLoop,
        metrics: WorkerMetrics,
        middleware: Sequence[Middleware],
        context: contextvars.Context,
        router: FailureRouter | None = None,
        events: EventStream | None = None,
        dedup: Deduplicator | None = None,
    ) -> None:
        self._app = app
        self._loop = loop
        self._metrics = metrics
        if events is not None:
            middleware = (*middleware, events)  # it sees outcomes and progress like any other
        self._middleware = tuple(middleware)
        self._events = events
        """Started events (level ``all``); None unless the settings ask for them."""
        self._router = router
        """Moves failed jobs to a retry tier or the dead-letter topic; None: skip past them."""
        self._dedup = dedup
        """Idempotency keys: duplicates are acknowledged without running; None: no checks."""
        self._priorities = list(priorities)
        self._concurrency = worker.concurrency
        self._key_ordering = worker.key_ordering
        self._plain = not middleware
        """No middleware: successes skip building an Outcome."""
        weights = [worker.weights[list(Priority).index(p)] for p in priorities]
        self.dispatcher = Dispatcher(
            len(priorities),
            make_policy(worker.policy, weights),
            key_ordering=worker.key_ordering,
            clock=time.monotonic,
            schedule=loop.call_later,
            on_ready=self.pump,
        )
        self._runners = AsyncRunners(loop, self.complete, self._on_suspend, self.pump, context)
        self._pool = ThreadPool(
            loop, worker.threads or worker.concurrency, self._complete_batch, context
        )
        self.types = TypeTable(app, metrics, priorities, topics)
        self.in_flight = 0
        self.finished = 0
        self.last_end = 0.0
        """When the last job that succeeded ended (monotonic), for the exit summary."""
        """Offsets finished so far (the consumer thread commits after every ``commit_every``)."""
        self.held = 0
        """Offsets kept unfinished because an outcome hook failed."""
        self.stopping = False
        self._holds = Holds(
            loop,
            on_due=self._held_due,
            defer=self._defer if router is not None else None,
            waits=lambda work: not self.stopping and work.state.active,
        )
        """Jobs taken from the buffer before their ``not_before``."""
        self._ready: deque[Work] = deque()
        """Held jobs whose time came while every slot was taken."""
        self._pumping = False
        self._idle = IdleWaiters(loop, lambda: self.in_flight)
        self._hooks = Hooks(loop, metrics, middleware, on_settled=self.pump)
        self._skips = RateLimitedLog(_log, interval_s=10.0)

    @property
    def threads(self) -> int:
        """Pool threads started so far for plain-function handlers (the pool grows on demand)."""
        return self._pool.threads

    # -- intake --------------------------------------------------------------------------------

    def on_batch(self, batch: list[tuple[PartitionState, list[Message]]]) -> None:
        """Decode a consumed batch into the priority queues, then start what may start."""
        if self.stopping:
            for state, messages in batch:
                state.taken += len(messages)  # dropped: not finished, so redelivered later
            return
        decode = self._app.codec.decode
        find = self.types.find
        dedup = self._dedup
        queues = self.dispatcher.queues
        for state, messages in batch:
            if not state.active:
                continue
            tracker = state.tracker
            expected = state.expected
            queue = queues[state.pidx]
            pidx = state.pidx
            moved = state.moved
            for msg in messages:
                offset: int = msg.offset()  # type: ignore[assignment]
                if offset < expected:
                    # Delivered again within one assignment (e.g. by a resume racing a fetch):
                    # it is buffered or done already.
                    state.taken += 1
                    self._metrics.duplicates += 1
                    continue
                expected = offset + 1
                tracker.add(offset)
                if moved and offset in moved:
                    # Retried or dead-lettered by a previous owner in a committed transaction.
                    moved.discard(offset)
                    state.taken += 1
                    self._metrics.skipped_moved += 1
                    self._done(state, offset, True)
                    continue
                try:
                    job = decode(msg.value())  # type: ignore[arg-type]
                except Exception as exc:  # DecodeError; anything else is a codec bug
                    state.expected = expected
                    self._skip(state, msg, OutcomeKind.UNDECODABLE, _decode_error(exc, msg), None)
                    continue
                entry = find(job.type)
                if entry is None:
                    state.expected = expected
                    self._skip(state, msg, OutcomeKind.UNKNOWN_TYPE, None, job)
                    continue
                if (
                    dedup is not None
                    and job.idempotency_key is not None
                    and not self._admit(dedup, state, job, entry.job_type)
                ):
                    state.taken += 1
                    self._done(state, offset, True)
                    continue
                queue.append(
                    Work(
                        state, offset, msg.key(), job, entry.job_type, entry.gate, entry.stats[pidx]
                    )
                )
            state.expected = expected
        self.pump()

    def set_share(self, owned: Mapping[str, int], partitions: Mapping[str, int]) -> None:
        """The assignment changed: rate limits take this worker's new share of the fleet's."""
        self.types.set_share(owned, partitions)
        self.dispatcher.refresh_gates(self.types.gates)

    # -- starting ------------------------------------------------------------------------------

    def pump(self) -> None:
        """Start jobs until the concurrency is reached or nothing may start.

        Called after a batch arrived, and when a runner ran out of queued jobs (not after each
        job), so one call usually starts many jobs.
        """
        if self._pumping or self.stopping:
            return
        self._pumping = True
        try:
            pop_many = self.dispatcher.pop_many
            start = self._start
            ready = self._ready
            while True:
                free = self._concurrency - self.in_flight
                if free <= 0:
                    break
                if ready:
                    # Held jobs whose time came while every slot was taken go first.
                    self._begin(ready.popleft(), time.monotonic(), time.time() * 1000.0)
                    continue
                works = pop_many(free)
                if not works:
                    break
                wall_ms = time.time() * 1000.0
                now = time.monotonic()
                for work in works:
                    start(work, now, wall_ms)
        finally:
            self._pumping = False

    def _start(self, work: Work, now: float, wall_ms: float) -> None:
        state = work.state
        state.taken += 1
        state.started_next = work.offset + 1
        state.in_flight += 1
        if work.job.not_before is not None and self._holds.take(work, wall_ms):
            return  # not due yet: held without a slot (then it starts first), or deferred
        self._begin(work, now, wall_ms)

    def _held_due(self, work: Work) -> None:
        state = work.state
        if self.stopping or not state.active:
            # Never started: its offset stays unfinished and the job is delivered again.
            state.in_flight -= 1
            self.dispatcher.release(work)
            if self._idle.waiting and state.in_flight == 0:
                self._idle.wake()
            return
        if self.in_flight < self._concurrency:
            self._begin(work, time.monotonic(), time.time() * 1000.0)
        else:
            self._ready.append(work)

    def _defer(self, work: Work) -> None:
        """Move a job far ahead of its ``not_before`` to ``<ns>.deferred`` (see ``_holds``)."""
        assert self._router is not None
        job = work.job
        state = work.state
        dedup = self._dedup if job.idempotency_key is not None else None
        keys = functools.partial(self._moved_key, dedup, work) if dedup is not None else None
        self._skips.warning(
            "deferred", "%s[%d]@%d is not due for %.1f s: moved to the deferred topic, the "
            "scheduler releases it when due (produce such jobs to the deferred topic)",
            state.topic, state.partition, work.offset,
            ((job.not_before or 0) - time.time() * 1000) / 1000,
            extra={"job_id": job.id, "job_type": job.type},
        )  # fmt: skip
        self._router.defer(state.topic, state.partition, work.offset, job, work.key,
                           lambda done: self._deferred(work, done), keys)  # fmt: skip

    def _deferred(self, work: Work, done: bool) -> None:
        """The deferral is in the open transaction (or was given up): finish the offset."""
        work.state.in_flight -= 1
        self.dispatcher.release(work)
        self._done(work.state, work.offset, done)
        self.pump()

    def _begin(self, work: Work, now: float, wall_ms: float) -> None:
        """Take a slot and call the handler."""
        self.in_flight += 1
        work.stats.started += 1
        if self._events is not None:
            self._events.started(work.job)
        self._launch(work, now, wall_ms)

    def _launch(self, work: Work, now: float, wall_ms: float) -> None:
        """Call the handler of a started job (on a runner or the thread pool)."""
        state = work.state
        job = work.job
        job_type = work.job_type
        queued_ms = wall_ms - (job.not_before or job.created_at)
        work.stats.latency.observe(queued_ms * 0.001 if queued_ms > 0 else 0.0)
        work.started = now
        entry = self.types.entries[job.type]
        try:
            kwargs = entry.codec.decode(job.type, job.payload)
        except DecodeError as exc:
            self._finish(work, OutcomeKind.FAILED, exc, 0.0)
            return
        limit = entry.time_limit
        if job_type.wants_ctx:
            ctx = JobContext(
                job,
                topic=state.topic,
                partition=state.partition,
                offset=work.offset,
                key=work.key,
                deadline=now + limit if limit is not None else None,
                on_progress=self._hooks.progress,
            )
            kwargs["ctx"] = ctx
            work.ctx = ctx
        work.kwargs = kwargs
        if job_type.is_async:
            self._runners.submit(work)
        else:
            if limit is not None:
                work.timer = self._loop.call_later(limit, self._expire, work)
            self._pool.submit(work)

    def _on_suspend(self, work: Work) -> None:
        # A coroutine job only needs its time limit armed once it awaits something: until then
        # it runs synchronously and nothing could interrupt it anyway.
        limit = self.types.entries[work.job.type].time_limit
        if limit is not None and work.timer is None and not work.finished:
            delay = work.started + limit - time.monotonic()
            work.timer = self._loop.call_later(max(0.0, delay), self._expire, work)

    def _expire(self, work: Work) -> None:
        if work.finished:
            return
        work.expired = True
        work.timer = None
        limit = self.types.entries[work.job.type].time_limit or 0.0
        self._finish(
            work,
            OutcomeKind.TIMED_OUT,
            TimeLimitError(work.job.type, limit),
            time.monotonic() - work.started,
        )
        # A coroutine is cancelled; a thread cannot be: its result is ignored when it returns.
        self._runners.cancel_job(work)
        self.pump()

    # -- finishing -----------------------------------------------------------------------------

    def complete(self, work: Work, error: BaseException | None, ended: float) -> None:
        """A handler returned (``error`` None) or raised. The caller pumps afterwards."""
        if work.finished:
            return  # failed at its deadline already; the late result is discarded
        if (
            error is None
            and self._plain
            and (self._dedup is None or work.job.idempotency_key is None)
        ):
            # The common case, inlined: a success with no middleware to tell, no key to settle.
            work.finished = True
            if work.timer is not None:
                work.timer.cancel()
                work.timer = None
            stats = work.stats
            stats.succeeded += 1
            stats.duration.observe(ended - work.started)
            self.in_flight -= 1
            state = work.state
            state.in_flight -= 1
            if work.gate is not None or self._key_ordering:
                self.dispatcher.release(work)
            tracker = state.tracker
            tracker.finish(work.offset)
            state.commit_offset = tracker.watermark  # type: ignore[assignment]
            self.finished += 1
            self.last_end = ended
            if self._idle.waiting and not state.in_flight:
                self._idle.wake()
            return
        duration = ended - work.started
        if error is None:
            self._finish(work, OutcomeKind.SUCCEEDED, None, duration)
            return
        if is_call_error(error):
            error = PayloadValidationError(work.job.type, str(error))
        self._finish(work, OutcomeKind.FAILED, error, duration)

    def _complete_batch(self, batch: list[Completion]) -> None:
        complete = self.complete
        for work, error, ended in batch:
            complete(work, error, ended)
        self.pump()

    def _finish(
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
        the key of a job that holds one is settled in the same transaction as its offset."""
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
            )
            keys = None
            if dedup is not None:
                keys = functools.partial(self._moved_key, dedup, work)
            router.route(failure, lambda moved: self._moved(work, moved), keys)
            return
        if dedup is not None:
            succeeded = kind is OutcomeKind.SUCCEEDED
            records = self._settle_key(
                dedup, work, KeyOutcome.SUCCEEDED if succeeded else KeyOutcome.DEAD
            )
            if records:
                # The slot is free now; the offset finishes once its key's record is in the
                # open transaction (the consumer thread writes it within a poll or so).
                self._free(work)
                state, offset = work.state, work.offset
                dedup.write(state, offset, records, lambda ok: self._done(state, offset, ok))
                return
        self._settle(work, done)

    def _admit(
        self, dedup: Deduplicator, state: PartitionState, job: Job, job_type: JobType
    ) -> bool:
        """Whether a job with an idempotency key runs (False: acknowledged as a duplicate)."""
        try:
            admitted = dedup.admit(state, job, job_type)
        except Exception as exc:
            # The store failed: run the job (at least once) rather than lose it.
            self._skips.warning(
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
            self._skips.warning(
                "dedup", "could not settle idempotency key %r: %s", work.job.idempotency_key,
                exc, extra={"job_id": work.job.id, "job_type": work.job.type},
            )  # fmt: skip
            return []

    def _moved_key(self, dedup: Deduplicator, work: Work, dead: bool) -> list[Record]:
        """The records for the key of a failed job, once the router decided its move."""
        return self._settle_key(dedup, work, KeyOutcome.DEAD if dead else KeyOutcome.RETRYING)

    def _moved(self, work: Work, done: bool) -> None:
        """The move of a failed job is in the open transaction (or was given up).

        This comes after the batch that freed the job's handler was pumped, so the slot it
        frees must start the next queued job here: otherwise a queue whose slots were all
        taken by failing jobs would wait for a batch that may never come.
        """
        self._settle(work, done)
        self.pump()

    def _settle(self, work: Work, done: bool) -> None:
        """Free the job's slot and, if ``done``, mark its offset finished."""
        self._free(work)
        self._done(work.state, work.offset, done)

    def _free(self, work: Work) -> None:
        """The job's handler is over: its slot (and its key, with key ordering) is free."""
        self.in_flight -= 1
        work.state.in_flight -= 1
        self.dispatcher.release(work)

    def _done(self, state: PartitionState, offset: int, done: bool) -> None:
        if done:
            tracker = state.tracker
            tracker.finish(offset)
            state.commit_offset = tracker.watermark  # type: ignore[assignment]
            self.finished += 1
            self.last_end = time.monotonic()
        else:
            self.held += 1
        if self._idle.waiting and state.in_flight == 0:
            self._idle.wake()

    def _skip(
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
            self._skips.warning(
                reason,
                "skipping a job of unknown type %r at %s",
                job.type,
                where,
                extra={"job_id": job.id, "job_type": job.type},
            )
        else:
            error_obj = error
            self._skips.warning(reason, "skipping an undecodable message at %s: %s", where, error)
        self._end_unrun(state, msg, kind, error_obj, job, msg.offset())  # type: ignore[arg-type]

    def _end_unrun(
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
            self._done(state, offset, done)

        def settle(done: bool) -> None:
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
                self._router.route(failure, finished)
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
            if not self._hooks.outcome(outcome, settle):
                return
        settle(True)

    def move_poison(self, state: PartitionState, msg: Message, error: BaseException) -> None:
        """Dead-letter, without running it, a message that killed its worker process every time
        it ran alone (see ``_poison``); its offset is finished once the move is made."""
        offset: int = msg.offset()  # type: ignore[assignment]
        if self.stopping or not state.active or offset < state.expected:
            state.taken += 1  # dropped as on_batch drops: not finished, so delivered again
            return
        state.expected = offset + 1
        state.tracker.add(offset)
        state.taken += 1
        try:
            job = self._app.codec.decode(msg.value())  # type: ignore[arg-type]
        except Exception:
            job = None  # dead-lettered with its raw bytes
        self._end_unrun(state, msg, OutcomeKind.POISON_PILL, error, job, offset)

    # -- rebalances and shutdown ---------------------------------------------------------------

    def drop(self, states: Iterable[PartitionState]) -> int:
        """Forget the not-started jobs of ``states``; their offsets stay unfinished."""
        states = set(states)
        dropped = self.dispatcher.drop(states)
        for work in dropped:
            work.state.taken += 1
        ready = [w for w in self._ready if w.state in states]
        if ready:
            # Held jobs due while every slot was taken: taken already, never started.
            self._ready = deque(w for w in self._ready if w.state not in states)
            for work in ready:
                work.state.in_flight -= 1
                self.dispatcher.release(work)
        return len(dropped) + len(ready)

    async def wait_idle(self, states: Iterable[PartitionState], timeout: float) -> bool:
        """Wait until no job of ``states`` (of any partition: empty) runs; False on timeout."""
        return await self._idle.wait(frozenset(states), timeout)

    async def close(self) -> None:
        """Stop the executors (threads still inside a job are left to finish on their own)."""
        self._pool.close()
        await self._runners.close()


def _decode_error(exc: Exception, msg: Message) -> DecodeError:
    if isinstance(exc, DecodeError):
        return exc
    raw = msg.value()
    reason = "an empty message (tombstone)" if raw is None else f"{type(exc).__name__}: {exc}"
    error = DecodeError(f"cannot decode the message: {reason}", bytes(raw or b""))
    error.__cause__ = exc
    return error
