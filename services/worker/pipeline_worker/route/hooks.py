"""Calling the middleware hooks, and logging failed jobs, without ever failing the worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from pipeline._ratelog import RateLimitedLog

from .._metrics import WorkerMetrics
from .outcome import JobHooks, Outcome, OutcomeKind

if TYPE_CHECKING:
    from pipeline._context import JobContext

    from .._work import Work

_log = logging.getLogger("pipeline.worker.jobs")

Resolve = Callable[[bool], None]
"""``resolve(finished)``: the outcome is handled; False keeps the offset unfinished."""


class Hooks:
    """The middleware of a worker, called safely from the job path."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        metrics: WorkerMetrics,
        middleware: Sequence[JobHooks],
        *,
        on_resolved: Callable[[], None],
    ) -> None:
        self._loop = loop
        self._metrics = metrics
        self._middleware = tuple(middleware)
        self._on_resolved = on_resolved
        self._pending: set[asyncio.Task[None]] = set()
        self._failures = RateLimitedLog(_log, interval_s=1.0, burst=10)
        self._errors = RateLimitedLog(_log, interval_s=10.0, burst=5)

    def outcome(self, outcome: Outcome, resolve: Resolve) -> bool:
        """Run every ``on_outcome``.

        True: all done, the caller marks the offset finished now. False: ``resolve`` is (or
        will be, once the returned awaitables are done) called instead.
        """
        pending: list[Awaitable[None]] = []
        ok = True
        for middleware in self._middleware:
            try:
                awaitable = middleware.on_outcome(outcome)
            except Exception as exc:
                self._failed("on_outcome", middleware, exc)
                ok = False
                continue
            if awaitable is not None:
                pending.append(awaitable)
        if not pending:
            if not ok:
                resolve(False)
                return False
            return True

        async def wait() -> None:
            failed = not ok
            try:
                for awaitable in pending:
                    try:
                        await awaitable
                    except asyncio.CancelledError as exc:
                        failed = True
                        current = asyncio.current_task()
                        if current is not None and current.cancelling():
                            raise  # this wait is cancelled (the worker stops): resolved below
                        self._failed("on_outcome", None, exc)  # what the hook returned was
                    except Exception as exc:
                        self._failed("on_outcome", None, exc)
                        failed = True
            finally:
                # Always: a wait that ended without it kept the job's slot for good.
                resolve(not failed)
                self._on_resolved()

        task = self._loop.create_task(wait())
        self._pending.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._pending.discard)
        return False

    def progress(self, ctx: JobContext, fraction: float, detail: str | None) -> None:
        """``ctx.progress()`` was called (on the handler's thread)."""
        self._metrics.progress += 1
        for middleware in self._middleware:
            try:
                middleware.on_progress(ctx, fraction, detail)
            except Exception as exc:
                self._failed("on_progress", middleware, exc)

    def _failed(self, hook: str, middleware: JobHooks | None, exc: BaseException) -> None:
        self._metrics.hook_failures += 1
        name = type(middleware).__name__ if middleware is not None else "middleware"
        self._errors.error(
            hook, "%s.%s failed: %r", name, hook, exc, exc_info=exc, extra={"hook": hook}
        )

    def log_failure(self, work: Work, kind: OutcomeKind, error: BaseException | None) -> None:
        """One WARNING line per failed job (at most 10 a second per type), traceback at DEBUG."""
        job = work.job
        extra = {
            "job_id": job.id,
            "job_type": job.type,
            "attempt": job.attempt,
            "partition": f"{work.state.topic}[{work.state.partition}]@{work.offset}",
        }
        what = "timed out" if kind is OutcomeKind.TIMED_OUT else "failed"
        self._failures.warning(
            job.type, "job %s (%s) %s: %r", job.id, job.type, what, error, extra=extra
        )
        if _log.isEnabledFor(logging.DEBUG) and error is not None:
            _log.debug("job %s traceback", job.id, exc_info=error, extra=extra)
