"""The per-job path on the event loop: decode, queue, start, finish, mark the offset done.

Everything here runs on the event loop thread and is written for throughput: batches in,
plain attribute updates, no locks, no per-job logging, no per-job task or wake-up. The hot
loop is :meth:`Processor.on_batch` (decoding in :mod:`.decoding`) -> :meth:`Processor.pump` ->
an executor -> :meth:`complete`. Every other end of a job (failures, outcome hooks, keys,
messages that never run) is in :mod:`..route.endings`; jobs taken before their ``not_before``
are in :mod:`..dispatch.holds`; time limits and the threads that outlive their jobs in
:mod:`.overtime`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from pipeline import (
    DecodeError,
    PayloadValidationError,
    Pipeline,
    Priority,
)
from pipeline._calls import call_error, codec_failure
from pipeline._ratelog import RateLimitedLog

from .._metrics import WorkerMetrics
from .._work import IdleWaiters, PartitionState, Work
from ..dispatch.dispatcher import Dispatcher
from ..dispatch.holds import Holds
from ..dispatch.jobtypes import TypeTable
from ..dispatch.policies import make_policy
from ..dispatch.tenants import TenantTable
from ..route.endings import Endings
from ..route.followups import FollowUpWatch
from ..route.hooks import Hooks
from ..route.outcome import JobHooks, OutcomeKind
from .chain import executors
from .decoding import BatchDecoder
from .overtime import Overtime
from .runners import GIVEN_UP, Completion, ThreadPool

if TYPE_CHECKING:
    import contextvars

    from confluent_kafka import Message

    from pipeline._workersettings import WorkerSettings

    from ..route.dedup import Deduplicator
    from ..route.events import EventStream
    from ..route.router import FailureRouter

_log = logging.getLogger("pipeline.worker.jobs")


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
        middleware: Sequence[JobHooks],
        context: contextvars.Context,
        router: FailureRouter | None = None,
        events: EventStream | None = None,
        dedup: Deduplicator | None = None,
    ) -> None:
        if events is not None:
            middleware = (*middleware, events)  # it sees outcomes and progress like any other
        self._middleware = tuple(middleware)
        self._events = events
        """Started events (level ``all``); None unless the settings ask for them."""
        self._dedup = dedup
        """Idempotency keys: duplicates are acknowledged without running; None: no checks."""
        self._concurrency = worker.concurrency
        self._key_ordering = worker.key_ordering
        self._plain = not middleware
        """No middleware: successes skip building an Outcome."""
        weights = [worker.weights[list(Priority).index(p)] for p in priorities]
        self.tenants = TenantTable(worker.tenants, metrics)
        self.dispatcher = Dispatcher(
            len(priorities),
            make_policy(worker.policy, weights),
            key_ordering=worker.key_ordering,
            clock=time.monotonic,
            schedule=loop.call_later,
            on_ready=self.pump,
            fairness=self.tenants.weight if worker.tenants.fairness else None,
            room=lambda: self._concurrency - self.in_flight,
        )
        self._runners, self._pool, self._chain = executors(
            app.middleware, loop, worker.threads or worker.concurrency, context, self
        )
        self.types = TypeTable(app, metrics, priorities, topics)
        self.in_flight = 0
        self.finished = 0
        """Offsets finished so far (the consumer thread commits after every ``commit_every``)."""
        self.last_end = 0.0
        """When the last job that succeeded ended (monotonic), for the exit summary."""
        self.stuck = 0
        """Offsets kept unfinished because an outcome hook failed."""
        self.stopping = False
        self._pumping = False
        self.idle = IdleWaiters(loop, lambda: self.in_progress)
        """Waiting for the jobs of some partitions to end (revocation, shutdown)."""
        self._hooks = Hooks(loop, metrics, middleware, on_resolved=self.pump)
        self._skips = RateLimitedLog(_log, interval_s=10.0)
        self._endings = Endings(
            self,
            metrics=metrics,
            middleware=self._middleware,
            hooks=self._hooks,
            log=self._skips,
            router=router,  # moves failed jobs; None: skip past them
            dedup=dedup,
            events=events,
        )
        """How jobs end, unless they simply succeed (see :mod:`..route.endings`)."""
        self._overtime = Overtime(
            loop, self.types, self._pool, self._runners, self._chain,
            finish=self._endings.finish, release=self.dispatcher.release, pump=self.pump,
        )  # fmt: skip
        """Time limits, and plain functions whose thread outlives their job."""
        if self._chain is not None:
            self._chain.on_late = self._overtime.threads_back
        self._follow_ups = FollowUpWatch(
            loop, app.settings, self.complete, self.pump, free=self.free_slot,
            outlives=self._overtime.ended if self._chain is not None else None,
        )  # fmt: skip
        """Jobs that succeeded, until Kafka answered for the jobs they enqueued."""
        self._decoder = BatchDecoder(
            app=app,
            types=self.types,
            queues=self.dispatcher.queues,
            tenants=self.tenants,
            endings=self._endings,
            metrics=metrics,
            dedup=dedup,
        )
        self._holds = Holds(
            loop,
            start=lambda work: self._begin(work, time.monotonic(), time.time() * 1000.0),
            room=lambda: self.in_flight < self._concurrency,
            gone=self._held_gone,
            defer=self._endings.defer if router is not None else None,
            waits=lambda work: not self.stopping and work.state.active,
        )
        """Jobs taken from the buffer before their ``not_before``."""

    @property
    def in_progress(self) -> int:
        """Jobs running, and those whose end waits for Kafka's answers for their follow-ups."""
        return self.in_flight + self._follow_ups.freed_early

    @property
    def pool(self) -> ThreadPool:
        """The threads of plain-function handlers: how many started, how many are overdue."""
        return self._pool

    # -- intake --------------------------------------------------------------------------------

    def on_batch(self, batch: list[tuple[PartitionState, list[Message]]]) -> None:
        """Decode a consumed batch into the priority queues (:mod:`.decoding`), then start what
        may start."""
        if self.stopping:
            for state, messages in batch:
                state.taken += len(messages)  # dropped: not finished, so redelivered later
            return
        self._decoder.queue(batch)
        self.pump()

    def set_share(self, owned: Mapping[str, int], partitions: Mapping[str, int]) -> None:
        """The assignment changed: limits take this worker's new share of the fleet's."""
        self.types.set_share(owned, partitions)
        self.tenants.set_share(owned, partitions)
        self.dispatcher.refresh_limits((*self.types.limits, *self.tenants.limits))
        if self._dedup is not None:
            self._dedup.partition_counts(partitions)

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
            begin = self._begin
            take = self._holds.take
            ready = self._holds.ready
            while True:
                free = self._concurrency - self.in_flight
                if free <= 0:
                    if ready:
                        self._holds.start_commit_points()
                    break
                if ready:
                    # Held jobs whose time came while every slot was taken go first.
                    begin(ready.popleft(), time.monotonic(), time.time() * 1000.0)
                    continue
                works = pop_many(free)
                if not works:
                    break
                wall_ms = time.time() * 1000.0
                now = time.monotonic()
                for work in works:
                    # Out of the buffer: counted as taken and started, held or not.
                    state = work.state
                    state.taken += 1
                    state.started_next = work.offset + 1
                    state.in_flight += 1
                    if work.job.not_before is not None and take(work, wall_ms):
                        continue  # not due yet: held without a slot (it starts first), or deferred
                    begin(work, now, wall_ms)
        finally:
            self._pumping = False

    def given_up(self, work: Work) -> None:
        """A plain function queued for a pool thread, given up before one took it: never run,
        it is delivered again (see :data:`~.runners.GIVEN_UP`; with interceptors, its chain)."""
        work.finished = True
        if work.timer is not None:
            work.timer.cancel()
            work.timer = None
        if work.follow_ups is not None:
            work.follow_ups.failed()  # an interceptor's enqueues: sent as any enqueue is
        self.in_flight -= 1
        self._held_gone(work)

    def _held_gone(self, work: Work) -> None:
        """A held job given up (stopping, revoked): never started, it is delivered again."""
        state = work.state
        state.in_flight -= 1
        self.dispatcher.release(work)
        if self.idle.waiting and state.in_flight == 0:
            self.idle.wake()
        self.pump()  # the slots it held may have admitted other partitions' jobs

    def _begin(self, work: Work, now: float, wall_ms: float) -> None:
        """Take a slot and call the handler (on a runner or the thread pool)."""
        self.in_flight += 1
        job = work.job
        stats = work.stats
        stats.started += 1
        if self._events is not None:
            self._events.started(job)
        queued_ms = wall_ms - (job.not_before or job.created_at)
        queued_s = queued_ms * 0.001 if queued_ms > 0 else 0.0
        stats.latency.observe(queued_s)
        tenant = work.tenant_stats
        if tenant is not None:
            tenant.started += 1
            tenant.wait.observe(queued_s)
        work.started = now
        job_type = work.job_type
        entry = self.types.entries[job.type]
        try:
            # Decoded, and checked against the handler's annotations when it has any.
            kwargs = entry.loads[job.payload_encoding](job.payload)
        except (DecodeError, PayloadValidationError) as exc:
            self._endings.finish(work, OutcomeKind.FAILED, exc, 0.0)
            return
        except Exception as exc:  # a payload codec's or validator's own bug: the job fails
            error = codec_failure(job.type, exc, job.payload)
            self._endings.finish(work, OutcomeKind.FAILED, error, 0.0)
            return
        limit = entry.time_limit
        chain = self._chain
        if job_type.wants_ctx or chain is not None:
            deadline = now + limit if limit is not None else None
            ctx = work.handler_context(deadline, self._hooks.progress)
            if chain is None:
                kwargs["ctx"] = ctx  # with interceptors, the innermost call adds it
        work.kwargs = kwargs
        if job_type.is_async or chain is not None:
            self._runners.submit(work)  # with interceptors every job runs its chain there
        else:
            if limit is not None:
                self._overtime.arm(work, limit)
            self._pool.submit(work)

    def on_suspend(self, work: Work) -> None:
        self._overtime.on_suspend(work)

    def cancelled_out(self, work: Work) -> None:
        """A coroutine cancelled at its time limit is out of its runner: its key and its
        type's and tenant's slots are free now (see :mod:`.overtime`)."""
        self._overtime.out(work)
        self.pump()

    # -- finishing -----------------------------------------------------------------------------

    def complete(self, work: Work, error: BaseException | None, ended: float) -> None:
        """A handler returned (``error`` None) or raised. The caller pumps afterwards."""
        if work.follow_ups is not None:  # the handler enqueued jobs
            if error is None and self._follow_ups.hold(work, ended):
                return  # completed again once Kafka answered for each of them
            error = self._follow_ups.release(work, error)
        if work.finished:
            # Failed at its deadline already; the late result is discarded. Its thread is back
            # only now: so are its key and its type's and tenant's slots (see free_slot).
            if self._chain is None:
                self._overtime.back(work)
            return
        # A chain that ended without waiting for its plain function's thread: the job ends
        # now, its thread keeps its key and its caps (see free_slot).
        outlived = self._chain is not None and self._overtime.ended(work)
        if error is None and self._plain and not outlived:
            # The common case, inlined: a success with no middleware to tell.
            work.finished = True
            if work.timer is not None:
                work.timer.cancel()
                work.timer = None
            stats = work.stats
            stats.succeeded += 1
            stats.duration.observe(ended - work.started)
            if self._dedup is not None and work.job.idempotency_key is not None:
                self._endings.key_succeeded(work)  # settled in the offset's transaction
                return
            state = work.state
            state.in_flight -= 1
            if work.slot_freed:
                self._follow_ups.freed_ended()
            else:
                self.in_flight -= 1
                if work.limit is not None or work.tenant_limit is not None or self._key_ordering:
                    self.dispatcher.release(work)
            state.commit_offset = state.tracker.finish(work.offset)  # type: ignore[assignment]
            self.finished += 1
            self.last_end = ended
            if not state.in_flight and self.idle.waiting:
                self.idle.wake()
            return
        duration = ended - work.started
        if error is None:
            self._endings.finish(work, OutcomeKind.SUCCEEDED, None, duration)
            return
        self._endings.finish(work, OutcomeKind.FAILED, call_error(work.job.type, error), duration)

    def complete_batch(self, batch: list[Completion]) -> None:
        complete = self.complete
        for work, error, ended, _ in batch:
            if error is GIVEN_UP and not work.finished:
                self.given_up(work)
            else:
                # Run, or ended already (at its deadline, while its thread took it only to
                # give it up): complete() takes its thread back.
                complete(work, error, ended)
        self.pump()

    def move_poison(self, state: PartitionState, msg: Message, error: BaseException) -> None:
        """Dead-letter, without running it, a message that killed its worker process every time
        it ran alone (see :mod:`..recovery.poison`); its offset is finished once the move is
        made."""
        if self.stopping:
            state.taken += 1  # dropped as on_batch drops: not finished, so delivered again
            return
        self._decoder.poison(state, msg, error)

    # -- rebalances and shutdown ---------------------------------------------------------------

    def drop(self, states: Iterable[PartitionState]) -> int:
        """Forget the not-started jobs of ``states``; their offsets stay unfinished."""
        states = set(states)
        # First the held jobs that came due while every slot was taken: the dispatcher's drop
        # pumps when it frees limit slots, and would start them.
        ready = self._holds.drop(states)
        for work in ready:
            work.state.in_flight -= 1
            self.dispatcher.release(work)  # what this admits of ``states`` is dropped next
        dropped = self.dispatcher.drop(states)
        for work in dropped:
            work.state.taken += 1
        if ready:
            self.pump()  # their slots may have admitted other partitions' jobs
        return len(dropped) + len(ready)

    # -- the endings' calls (JobSlots) ---------------------------------------------------------

    def free_slot(self, work: Work) -> None:
        if work.slot_freed:
            self._follow_ups.freed_ended()  # freed at its handler's return already
            return
        self.in_flight -= 1
        # A handler that still runs (a thread, a cancelled coroutine) keeps the job's key and
        # its type's and tenant's slots until it is out (see :mod:`.overtime`); its
        # concurrency slot is free.
        if not self._overtime.keeps(work):
            self.dispatcher.release(work)

    def release(self, work: Work) -> None:
        self.dispatcher.release(work)

    def offset_ended(self, state: PartitionState, *, finished: bool, count: int = 1) -> None:
        if finished:
            self.finished += count
            self.last_end = time.monotonic()
        elif not state.released:  # given up at a revocation: its next owner runs it again
            self.stuck += count
        if self.idle.waiting and state.in_flight == 0:
            self.idle.wake()

    async def wait_idle(self, states: Iterable[PartitionState], timeout: float) -> bool:
        """Wait until no job of ``states`` (of any partition: empty) runs; False on timeout."""
        return await self.idle.wait(frozenset(states), timeout)

    async def close(self) -> None:
        """Stop the executors (threads still inside a job are left to finish on their own)."""
        self._pool.close()
        self._follow_ups.close()
        await self._runners.close()
