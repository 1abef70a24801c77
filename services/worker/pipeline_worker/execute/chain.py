"""Interceptors around a job's handler: one chain built per worker, run on a runner per job.

With interceptors (``Pipeline(middleware=[...])``) every job, coroutine or plain function, runs
as a coroutine on the async runners: the chain, outermost first, then the innermost ``next``,
which calls a coroutine handler in place or hands a plain function to the thread pool and
awaits its run there. The time limit and the failure classification are those of any coroutine
job: the runner cancels the chain at the deadline, and what leaves the chain (a value, or an
error) is the job's end. A chain may end before its plain function's thread is back (the time
limit, or an interceptor that stopped waiting for ``next``): the thread then keeps the job's key
and its type's and tenant's slots until it is back (:mod:`.overtime`). A plain function
given up while it waits for a thread (:data:`.runners.GIVEN_UP`) is not run: ``next`` raises a
cancellation and the job ends as never started, whatever leaves the chain. Without
interceptors none of this exists and jobs go straight to the runners or the pool.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol, cast

from pipeline._calls import (
    call_error,
    compose,
    handler_kwargs,
    plain_function_twice,
    start_coroutine,
)
from pipeline._interceptors import Interceptor, JobCall

from .._work import Work
from .runners import GIVEN_UP, AsyncRunners, Completion, GivenUpError, ThreadPool


def _no_pool(work: Work) -> None:
    raise RuntimeError("the chain was built without a thread pool")


def _no_late(batch: list[Completion]) -> None:
    raise RuntimeError("the chain was built without a receiver of late threads")


class Chain:
    """The interceptors of a worker, composed once; :meth:`start` makes one job's coroutine."""

    def __init__(
        self, interceptors: Sequence[Interceptor], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._loop = loop
        self.on_late: Callable[[list[Completion]], None] = _no_late
        """Gets the plain functions whose thread came back after their job ended (set by the
        processor: :meth:`.Overtime.threads_back`)."""
        self.submit: Callable[[Work], None] = _no_pool
        """Hands a plain-function job to the thread pool (set once the pool exists)."""
        self._waiting: dict[Work, asyncio.Future[tuple[BaseException | None, Any]]] = {}
        """Plain-function jobs on the pool, by their work, and the future their chain awaits
        (or awaited: a job stays here until its thread is back, even if its chain was cancelled
        or ended)."""
        self._call = compose(interceptors, self._innermost)

    def start(self, work: Work) -> Coroutine[Any, Any, Any]:
        """The coroutine that runs ``work``'s chain (its context and kwargs are ready)."""
        assert work.ctx is not None
        assert work.kwargs is not None
        call = JobCall(work.job, work.ctx, work.job_type, work.kwargs, work)
        return cast("Coroutine[Any, Any, Any]", self._call(call))

    async def _innermost(self, call: JobCall) -> Any:
        work: Work = call.run
        job_type = work.job_type
        kwargs = handler_kwargs(job_type, call)
        if job_type.is_async:
            return await start_coroutine(job_type, kwargs)
        if work in self._waiting:
            # One run of a job on the pool at a time: a second would share (and overwrite) the
            # first's record, and the first's chain would wait for its thread for ever.
            raise plain_function_twice(work.job)
        work.kwargs = kwargs
        work.context = contextvars.copy_context()
        started = work.started
        future: asyncio.Future[tuple[BaseException | None, Any]] = self._loop.create_future()
        self._waiting[work] = future  # until its thread is back, whatever its chain does
        self.submit(work)
        try:
            error, result = await future
        finally:
            work.started = started  # the job started with its chain, not with its thread
        if error is GIVEN_UP:
            # Given up before a thread took it: not run, whatever the chain makes of this
            # cancellation; its job ends as never started (``ends.given_up``, see executors).
            work.given_up = True
            raise GivenUpError(f"job {work.job.id} given up before a thread took it")
        if error is not None:
            # Raised here, not through the future: a future refuses a StopIteration (this
            # coroutine turns one into a RuntimeError, as any coroutine does).
            raise call_error(work.job.type, error)
        return result

    def on_pool(self, work: Work) -> bool:
        """Whether ``work``'s plain function is on the pool (queued or running on a thread)."""
        return work in self._waiting

    def resolve(self, batch: list[Completion]) -> None:
        """Plain functions ran on the pool: their chains carry on with the result or error
        (those still waiting for it); those whose job ended meanwhile go to :attr:`on_late`."""
        waiting = self._waiting
        late: list[Completion] = []
        for completion in batch:
            work, error, _, result = completion
            future = waiting.pop(work, None)
            if future is not None and not future.done():
                future.set_result((error, result))  # for a task of the chain that still waits
            if work.finished or work.slot_freed:
                # Its job ended before its thread came back: at the time limit, or when its
                # chain ended without waiting (an interceptor gave up on ``next``), or it waits
                # for Kafka's answers for its follow-ups with its slot free.
                late.append(completion)
        if late:
            self.on_late(late)


class JobEnds(Protocol):
    """What the executors report to (the processor)."""

    def complete(self, work: Work, error: BaseException | None, ended: float) -> None: ...
    def complete_batch(self, batch: list[Completion]) -> None: ...
    def given_up(self, work: Work) -> None: ...
    def on_suspend(self, work: Work) -> None: ...
    def cancelled_out(self, work: Work) -> None: ...
    def pump(self) -> None: ...


def executors(
    interceptors: Sequence[Interceptor],
    loop: asyncio.AbstractEventLoop,
    threads: int,
    context: contextvars.Context,
    ends: JobEnds,
) -> tuple[AsyncRunners, ThreadPool, Chain | None]:
    """The runners and the thread pool, and the chain between them when there are interceptors.

    Without interceptors the pool reports its jobs' ends itself (``ends.complete_batch``);
    with them, it resolves the awaiting chains, whose ends the runners report (a plain
    function given up on the pool, :data:`.runners.GIVEN_UP`, ends as never run whatever
    left its chain).
    """
    if not interceptors:
        pool = ThreadPool(loop, threads, ends.complete_batch, context)
        runners = AsyncRunners(
            loop, ends.complete, ends.on_suspend, ends.pump, context, on_late=ends.cancelled_out
        )
        return runners, pool, None
    chain = Chain(interceptors, loop)
    pool = ThreadPool(loop, threads, chain.resolve, context)
    chain.submit = pool.submit

    def done(work: Work, error: BaseException | None, ended: float) -> None:
        if work.given_up:  # its plain function was not run: whatever left the chain
            ends.given_up(work)
        else:
            ends.complete(work, error, ended)

    runners = AsyncRunners(
        loop, done, ends.on_suspend, ends.pump, context, chain.start, ends.cancelled_out
    )
    return runners, pool, chain
