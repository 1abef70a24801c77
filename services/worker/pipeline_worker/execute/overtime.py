"""Jobs that end before their handler does: time limits, and plain functions whose thread
outlives their job.

A coroutine past its time limit is cancelled, and may take its time to stop (a ``finally`` that
closes a connection) or not stop at all (it catches ``CancelledError`` and carries on). A thread
cannot be cancelled: a plain function's job ends at its deadline, or when an interceptor's chain
ends without waiting for its run on the pool (say ``asyncio.wait_for`` around ``next(call)``
gave up), while its thread still runs the handler. All follow one rule. The job's concurrency
slot is free at its end, and the pool may start another thread in its place
(:meth:`.ThreadPool.lend`; a coroutine holds no thread): a handler that never returns must not
take either for good. But its key (with key ordering) and its type's and tenant's slots are kept
until the handler is out: no two runs of a key at the same time, nor more runs of a type or a
tenant than its cap.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline import TimeLimitError

from .._work import Work
from ..route.outcome import OutcomeKind

if TYPE_CHECKING:
    from ..dispatch.jobtypes import TypeTable
    from .chain import Chain
    from .runners import AsyncRunners, Completion, ThreadPool

Finish = Callable[[Work, OutcomeKind, BaseException | None, float], None]
"""``finish(work, kind, error, duration)``: the job ends so (the endings' ``finish``)."""


class Overtime:
    """The time limits of one processor's jobs and the threads that outlive their jobs."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        types: TypeTable,
        pool: ThreadPool,
        runners: AsyncRunners,
        chain: Chain | None,
        *,
        finish: Finish,
        release: Callable[[Work], None],
        pump: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._types = types
        self._pool = pool
        self._runners = runners
        self._chain = chain
        self._finish = finish
        self._release = release
        """Frees a job's key and its type's and tenant's slots (the dispatcher's)."""
        self._pump = pump
        self._lent: set[Work] = set()
        """Jobs that ended while their plain function was on the pool, until it is back; a
        thread was lent for each."""
        self._cancelled: set[Work] = set()
        """Coroutine jobs cancelled at their time limit, until their runner is out of them."""
        self._kept: set[Work] = set()
        """Those of them whose concurrency slot is free: their release waits for the handler."""

    # -- time limits ---------------------------------------------------------------------------

    def arm(self, work: Work, limit: float) -> None:
        """A plain function without interceptors goes to the pool: its limit counts from now."""
        work.timer = self._loop.call_later(limit, self.expire, work)

    def on_suspend(self, work: Work) -> None:
        # A coroutine job only needs its time limit armed once it awaits something: until then
        # it runs synchronously and nothing could interrupt it anyway.
        limit = self._types.entries[work.job.type].time_limit
        if limit is not None and work.timer is None and not work.finished:
            delay = work.started + limit - time.monotonic()
            work.timer = self._loop.call_later(max(0.0, delay), self.expire, work)

    def expire(self, work: Work) -> None:
        """``work`` reached its time limit: it fails now; a coroutine is cancelled, a thread
        is left to return when it does (:meth:`ended`)."""
        if work.finished or work.given_up:
            return  # ended, or its chain ends as a job never run (``Work.given_up``)
        work.expired = True
        work.timer = None
        if work.follow_ups is not None:
            # Failed: what Kafka refuses of its follow-ups is logged as for any enqueue.
            work.follow_ups.failed()
        limit = self._types.entries[work.job.type].time_limit or 0.0
        # Before its end, which may free its slot at once: a thread lent (a plain function
        # still on the pool), a coroutine inside its runner (the handler, or the interceptors'
        # chain around either kind), or both; the job's key and caps wait for all to be out.
        self.ended(work)
        if work.runner is not None:
            self._cancelled.add(work)
        self._finish(
            work,
            OutcomeKind.TIMED_OUT,
            TimeLimitError(work.job.type, limit),
            time.monotonic() - work.started,
        )
        self._runners.cancel_job(work)
        self._pump()

    # -- threads that outlive their jobs -------------------------------------------------------

    def _on_pool(self, work: Work) -> bool:
        """Whether ``work``'s plain function is on the pool, queued or on a thread (with
        interceptors the chain knows; without, a plain function not ended is on the pool)."""
        if self._chain is not None:
            return self._chain.on_pool(work)
        return not work.job_type.is_async

    def ended(self, work: Work) -> bool:
        """``work`` ends now (call before its end): True if its plain function is still on the
        pool, and then a thread is lent in its place until it is back."""
        if work in self._lent:
            return True
        if not self._on_pool(work):
            return False
        self._lent.add(work)
        self._pool.lend()
        return True

    def keeps(self, work: Work) -> bool:
        """``work``'s concurrency slot is free: whether its handler still runs, so that its key
        and its type's and tenant's slots are freed when it is out (:meth:`back`,
        :meth:`out`), not now by the caller."""
        if work in self._lent or work in self._cancelled:
            self._kept.add(work)
            return True
        return False

    def out(self, work: Work) -> None:
        """A coroutine cancelled at its time limit left its runner (the caller pumps). With
        interceptors around a plain function, its thread may still run: the key and the caps
        then wait for :meth:`back` too."""
        if work in self._cancelled:
            self._cancelled.discard(work)
            self._free(work)

    def back(self, work: Work) -> None:
        """The thread of a job that ended before it is back (the caller pumps)."""
        if work not in self._lent:
            return  # it never ran (its job ended before a thread took it), or never outlived it
        if work.follow_ups is not None and work.finished:
            # What the thread enqueued after its job ended is sent as any enqueue is (a job
            # still waiting for Kafka's answers ends with them).
            work.follow_ups.failed()
        self._lent.discard(work)
        self._pool.give_back()
        self._free(work)

    def _free(self, work: Work) -> None:
        """Release what ``work`` kept once neither its thread nor its coroutine runs."""
        if work in self._kept and work not in self._lent and work not in self._cancelled:
            self._kept.discard(work)
            self._release(work)

    def threads_back(self, batch: list[Completion]) -> None:
        """Plain functions back from their thread after their job ended (with interceptors)."""
        for work, _, _, _ in batch:
            self.back(work)
        self._pump()
