"""Running handlers: coroutines on long-lived runner tasks, plain functions on a thread pool.

Async handlers. Creating an ``asyncio.Task`` per job costs several microseconds (creation,
scheduling, a done callback), more than a no-op job itself. Instead a few long-lived *runner*
tasks take jobs from a queue and drive each job's coroutine step by step. A job that completes
without suspending (no real I/O) costs one coroutine call; a job that suspends keeps its runner
and another runner takes over the queue. Every job still runs inside a real Task, so
``asyncio.current_task()``, ``asyncio.timeout()`` and libraries built on them behave as usual,
and every job runs in its own copy of the worker's ``contextvars`` context, as a Task would,
marked as the job's (:data:`pipeline._followups.RUNNING`: what it enqueues are its follow-ups;
a pool thread marks the plain function's job on itself instead,
:data:`pipeline._followups.ON_THIS_THREAD`).
A time limit cancels the runner while it is inside that job; the runner then carries on.

Sync handlers run on up to ``threads`` pool threads fed by a ``queue.SimpleQueue``. Completions
come back in batches: the first one of a batch wakes the event loop, the others ride along.
The pool grows on demand: it adds threads only when a job has waited ``GROW_AFTER_S`` in the
queue without a thread taking it (the threads are blocked, on I/O or sleeps, or the jobs are
long). Short jobs are run by a few threads taking job after job from the queue. Starting every
thread up front made each batch wake dozens of threads that then fought over the GIL: no-op
jobs drained a third slower.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from queue import SimpleQueue
from typing import Any

from pipeline._followups import ON_THIS_THREAD, RUNNING

from .._work import Work

_log = logging.getLogger("pipeline.worker")

GROW_AFTER_S = 0.02
"""How long a job may wait in the queue, untaken, before the pool grows.

Several GIL switch intervals (5 ms each): threads that merely wait for the GIL while the event
loop decodes a batch get it back well within this, and take every queued short job."""

CLOSE_WAIT_S = 5.0
"""How long closing waits for coroutine jobs to take their cancellation."""

Completion = tuple[Work, BaseException | None, float, Any]
"""A finished job, its error (``None``: it succeeded), when it ended (``time.monotonic``) and
what the handler returned."""


class GivenUpError(asyncio.CancelledError):
    """A job never run: queued for a pool thread, it was given up before one took it (its
    partition revoked past its grace, or the worker stopped after its final commit). It ends
    as a job never started, not as a failure: :data:`GIVEN_UP` is its :data:`Completion`'s
    error, and under interceptors the innermost ``next`` raises one, a cancellation as the
    stop's, which the interceptors let through (:attr:`.Work.given_up`)."""


GIVEN_UP = GivenUpError("given up before a thread took it")
OnDone = Callable[[Work, BaseException | None, float], None]
"""``on_done(work, error, ended)``: the job ended (``error`` None: it succeeded) at ``ended``."""


@types.coroutine
def _drive(
    coro: Coroutine[Any, Any, Any],
    context: contextvars.Context,
    on_suspend: Callable[[Work], None],
    work: Work,
) -> Generator[Any, Any, Any]:
    """``await coro``, running each of its steps inside ``context``.

    What the coroutine yields (futures, or ``None`` for a bare yield) goes to the enclosing
    task unchanged, and what the task sends or throws back (results, cancellation) goes to the
    coroutine, so the task machinery works as for a plain ``await``.
    """
    run = context.run
    try:
        yielded = run(coro.send, None)
    except StopIteration as stop:
        return stop.value
    on_suspend(work)
    while True:
        try:
            value = yield yielded
        except BaseException as exc:
            try:
                yielded = run(coro.throw, exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = run(coro.send, value)
            except StopIteration as stop:
                return stop.value


class AsyncRunners:
    """Runner tasks that drive coroutine jobs; see the module docstring."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_done: OnDone,
        on_suspend: Callable[[Work], None],
        refill: Callable[[], None],
        context: contextvars.Context,
        start: Callable[[Work], Coroutine[Any, Any, Any]] | None = None,
        on_late: Callable[[Work], None] | None = None,
    ) -> None:
        """``on_late(work)``: a job cancelled at its time limit (failed then already) is out of
        its runner."""
        self._loop = loop
        self._on_late = on_late
        self._start = start
        """Makes a job's coroutine (its interceptor chain); None: call the handler itself."""
        self._on_done = on_done
        self._on_job_suspend = on_suspend
        self._refill = refill
        self._context = context
        self._queue: deque[Work] = deque()
        self._idle: deque[asyncio.Future[None]] = deque()
        self._draining = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    def submit(self, work: Work) -> None:
        """Queue a job whose ``kwargs`` are ready; a runner picks it up soon (same loop turn)."""
        self._queue.append(work)
        if not self._draining:
            self._wake()

    def _wake(self) -> None:
        self._draining += 1
        while self._idle:
            waiter = self._idle.pop()
            if not waiter.done():
                waiter.set_result(None)
                return
        task = self._loop.create_task(self._run(), name=f"pipeline-runner-{len(self._tasks)}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self) -> None:
        queue = self._queue
        task = asyncio.current_task()
        assert task is not None
        on_done = self._on_done
        base = self._context
        start = self._start
        while True:
            while queue:
                work = queue.popleft()
                error: BaseException | None = None
                work.started = time.monotonic()
                try:
                    coro = (
                        work.job_type.handler(**(work.kwargs or {}))
                        if start is None
                        else start(work)
                    )
                    context = base.copy()
                    context.run(RUNNING.set, work)  # what it enqueues is its follow-ups
                    await _drive(coro, context, self._suspended, work)
                except asyncio.CancelledError as exc:
                    if self._closing or (task.cancelling() and not work.expired):
                        raise  # the runner itself is being cancelled (shutdown)
                    error = exc  # the time limit, or the handler's own CancelledError
                except BaseException as exc:
                    error = exc
                if self._closing:
                    # The stop cancelled the chain, and an interceptor kept the cancellation
                    # from leaving it: the job still ends as never started, with no outcome
                    # (reported, a plain function never run "succeeded", and its key with it).
                    raise asyncio.CancelledError
                if work.suspended:
                    work.runner = None
                    self._draining += 1
                if work.expired:
                    # Cancelled by the time limit: the job was failed at its deadline already.
                    # (Not a cancel of close(): that one ends the runner, at its next await.)
                    while task.cancelling() and not self._closing:
                        task.uncancel()
                    if self._on_late is not None:
                        self._on_late(work)
                else:
                    on_done(work, error, time.monotonic())
            # Out of queued jobs: start more (their slots freed meanwhile) before idling.
            self._refill()
            if queue:
                continue
            self._draining -= 1
            waiter = self._loop.create_future()
            self._idle.append(waiter)
            await waiter

    def _suspended(self, work: Work) -> None:
        # The job awaits real I/O and keeps this runner: another runner takes over the queue.
        work.suspended = True
        work.runner = asyncio.current_task()
        self._draining -= 1
        if self._queue and not self._draining:
            self._wake()
        self._on_job_suspend(work)

    def cancel_job(self, work: Work) -> None:
        """Cancel the runner that is inside ``work`` (called when its time limit passed)."""
        if work.runner is not None:
            work.runner.cancel()

    async def close(self, timeout_s: float = CLOSE_WAIT_S) -> None:
        """Cancel every runner (idle ones and those stuck in jobs past their deadline); wait
        up to ``timeout_s`` for them. A job that ignores its cancellation (it catches
        ``CancelledError`` and carries on) is left behind: the worker exits all the same."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        _, stuck = await asyncio.wait(tasks, timeout=timeout_s)
        if stuck:
            _log.warning(
                "%d job(s) ignored their cancellation for %gs: left running as the worker exits",
                len(stuck),
                timeout_s,
            )


class ThreadPool:
    """Pool threads running plain-function handlers; completions return to the loop in batches."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        size: int,
        on_batch: Callable[[list[Completion]], None],
        context: contextvars.Context,
    ) -> None:
        """A queued job of a released partition, or queued at :meth:`close`, is not run: it
        comes back with :data:`GIVEN_UP` as its error."""
        self._loop = loop
        self._size = size
        self._lent = 0
        self._on_batch = on_batch
        self._context = context
        self._jobs: SimpleQueue[Work | None] = SimpleQueue()
        self._done: deque[Completion] = deque()
        self._scheduled = False
        self._threads: list[threading.Thread] = []
        self._submitted = 0
        self._taken: list[int] = []
        """Jobs taken from the queue, per thread (each thread writes only its own counter)."""
        self._check: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads started so far."""
        return len(self._threads)

    @property
    def overdue(self) -> int:
        """Threads still inside a job that ended: past its time limit, or given up on by an
        interceptor (see :meth:`lend`)."""
        return self._lent

    def submit(self, work: Work) -> None:
        self._jobs.put(work)
        self._submitted += 1
        if not self._threads:
            self._start_thread()
        elif self._check is None and len(self._threads) < self._size:
            self._arm()

    def lend(self) -> None:
        """A job on the pool ended before its thread returned (its time limit, or its chain
        gave up on it): the thread may be kept for good (it cannot be killed), so another may
        start in its place, until :meth:`give_back`."""
        self._size += 1
        self._lent += 1
        if self._check is None and self._threads:
            self._arm()

    def give_back(self) -> None:
        """The job of a :meth:`lend` is back from its thread (the threads stay)."""
        self._size -= 1
        self._lent -= 1

    def _arm(self) -> None:
        self._check = self._loop.call_later(GROW_AFTER_S, self._grow, self._submitted)

    def _grow(self, submitted: int) -> None:
        """Add a thread for every job of the first ``submitted`` (those queued before arming,
        ``GROW_AFTER_S`` ago) that no thread has taken yet, up to the size."""
        self._check = None
        taken = sum(self._taken)
        if taken < submitted:
            for _ in range(min(submitted - taken, self._size - len(self._threads))):
                self._start_thread()
        if taken < self._submitted and len(self._threads) < self._size:
            self._arm()  # jobs still wait: look again (else the next submit arms it)

    def _start_thread(self) -> None:
        index = len(self._threads)
        self._taken.append(0)
        thread = threading.Thread(
            target=self._main, args=(index,), name=f"pipeline-pool-{index}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _main(self, index: int) -> None:
        get = self._jobs.get
        done = self._done
        this_thread = ON_THIS_THREAD  # thread-local: each pool thread marks its own job
        base = self._context
        taken = self._taken
        while True:
            work = get()
            if work is None:
                return
            taken[index] += 1
            error: BaseException | None = None
            result: Any = None
            if work.finished:
                pass  # failed at its deadline while it waited: not run
            elif work.state.released or self._closed:
                error = GIVEN_UP  # its partition went, or the worker stops: not run
            else:
                work.started = time.monotonic()
                try:
                    context = work.context if work.context is not None else base.copy()
                    this_thread.job = work  # what it enqueues is its follow-ups
                    result = context.run(work.job_type.handler, **(work.kwargs or {}))
                except BaseException as exc:
                    error = exc
            done.append((work, error, time.monotonic(), result))
            # One wake-up per batch: later completions find _scheduled set and ride along.
            if not self._scheduled:
                self._scheduled = True
                try:
                    self._loop.call_soon_threadsafe(self._drain)
                except RuntimeError:
                    return  # the loop is closed: the worker exited while this job ran

    def _drain(self) -> None:
        self._scheduled = False
        done = self._done
        batch = []
        while done:
            batch.append(done.popleft())
        if batch:
            self._on_batch(batch)

    def close(self) -> None:
        """Ask every thread to exit after its current job (threads stuck in a job are left);
        the jobs still queued are not run (:data:`GIVEN_UP`)."""
        self._closed = True
        if self._check is not None:
            self._check.cancel()
            self._check = None
        for _ in self._threads:
            self._jobs.put(None)
