"""One message run as the worker runs it, without Kafka: decode, payload, context,
interceptors, time limit, and the worker's verdict on a failure.

Every step is the library's own: the application's :class:`~pipeline.JobCodec`, the job type's
payload loading and validation (:meth:`~pipeline.JobType.load_payload`), the interceptor chain
(:mod:`pipeline._calls`) and the failure classification (:mod:`pipeline._failures`). What is
the test kit's: the event loop a run gets (the stub worker's, which its runs share, or a
fresh one), a thread per run of a plain-function handler, and reading the wall clock's due
times on a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from .._calls import (
    call_error,
    codec_failure,
    compose,
    handler_kwargs,
    plain_function_twice,
    start_coroutine,
)
from .._context import JobContext
from .._errors import DecodeError, PayloadValidationError, TimeLimitError, UnknownJobTypeError
from .._eventloop import LEFT_BEHIND_S, BoundedRunner
from .._failures import failed_job, group_members, judge_failure
from .._followups import RUNNING, FollowUps
from .._interceptors import CallNext, JobCall
from .._job import now_ms
from .._records import DeadLetterReason
from .._retry import Retry
from ._results import JobResult, JobStatus

if TYPE_CHECKING:
    from .._app import Pipeline
    from .._job import Job
    from .._registry import JobType
    from ._transport import SentMessage

T = TypeVar("T")
WORKER = "pipeline.testing"
"""The worker name a failed attempt's history records."""
_RAISED_BY = "raised by job "
"""How ``fail_fast``'s note on a raised error begins."""


@dataclass(frozen=True, slots=True)
class Execution:
    """A run's result, and the job its retry writes (``RETRY`` only)."""

    result: JobResult
    retry: Job | None = None


def execute(
    app: Pipeline,
    message: SentMessage,
    *,
    clock: Callable[[], int] | None,
    rand: random.Random,
    fail_fast: bool = False,
    loop: BoundedRunner | None = None,
) -> Execution:
    """Run the job in ``message`` once, at ``clock()`` (epoch ms; None: the wall clock).

    The fake clock stands still during a run, at the wall clock's reading when the run began:
    a due time the run computes on the wall clock (``Retry(at=datetime.now(UTC) + ...)``) is
    that far ahead on ``clock``, never less, and backoff and ``Retry(after=...)`` exactly so.
    ``fail_fast``: an error of the run other than :class:`Retry` is raised (with a note naming
    the job) instead of being classified. ``loop``: the event loop runs share (as a worker's
    jobs share one); None: a fresh one for this run.
    """
    try:
        job = app.codec.decode(message.value)
    except DecodeError as exc:
        reason = DeadLetterReason.DECODE_ERROR
        dead = JobResult(status=JobStatus.DEAD, job=None, attempt=0, error=exc, reason=reason)
        return Execution(dead)
    wall = now_ms()
    now = clock() if clock is not None else wall
    job_type = app.registry.find(job.type)
    if job_type is None:
        error: BaseException | None = UnknownJobTypeError(job.type)
        value = None
    else:
        error, value = _run(app, job, job_type, message, loop)
    if error is None:
        done = JobResult(status=JobStatus.SUCCEEDED, job=job, attempt=job.attempt, value=value)
        return Execution(done)
    if fail_fast and job_type is not None and not _retries_only(error):
        notes = getattr(error, "__notes__", None)
        if notes:  # one exception object raised by several runs names only the last one
            notes[:] = [note for note in notes if not note.startswith(_RAISED_BY)]
        error.add_note(f"{_RAISED_BY}{job.id} ({job.type}, attempt {job.attempt})")
        raise error
    verdict = judge_failure(job, job_type, error, wall, rand)
    if verdict.reason is not None:
        dead = JobResult(
            status=JobStatus.DEAD, job=job, attempt=job.attempt, error=error, reason=verdict.reason
        )
        return Execution(dead)
    verdict = replace(verdict, due_ms=now + verdict.due_ms - wall)  # on ``clock``
    retry = JobResult(
        status=JobStatus.RETRY,
        job=job,
        attempt=job.attempt,
        error=error,
        retry_at_ms=verdict.due_ms,
        retry_in_s=(verdict.due_ms - now) / 1000,
    )
    return Execution(retry, failed_job(job, verdict, error, now, WORKER))


def _retries_only(error: BaseException) -> bool:
    """Whether ``error`` is a :class:`Retry`, or a group of nothing else (a task group's)."""
    leaves = [m for m in group_members(error) if not isinstance(m, BaseExceptionGroup)]
    return bool(leaves) and all(isinstance(m, Retry) for m in leaves)


def _run(
    app: Pipeline, job: Job, job_type: JobType, message: SentMessage, loop: BoundedRunner | None
) -> tuple[BaseException | None, Any]:
    """(error, None) or (None, what the handler returned)."""
    codec = job_type.codec
    try:
        kwargs = job_type.payload_loaders(codec)[job.payload_encoding](job.payload)
    except (DecodeError, PayloadValidationError) as exc:
        return exc, None
    except Exception as exc:  # the codec's or validator's own bug: the job fails, as in a worker
        return codec_failure(job.type, exc, job.payload), None
    limit = job_type.options.time_limit
    ctx = JobContext(
        job,
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=message.key,
        deadline=time.monotonic() + limit if limit is not None else None,
        job_type=job_type,
    )
    chain = compose(app.middleware, _innermost(job_type))
    call = JobCall(job, ctx, job_type, kwargs)
    this_run = _Running()

    async def run() -> Any:
        RUNNING.set(this_run)  # what the run enqueues are its follow-ups, as in a worker
        if limit is None:
            return await chain(call)
        # As in the worker, the run fails at its deadline, whatever the chain does then: it is
        # cancelled, and given a moment to end (its interceptors see the cancellation, its
        # finally blocks run), as the worker's loop goes on; one that ignores its cancellation,
        # or awaits a thread that never returns, is left behind.
        running = asyncio.ensure_future(chain(call))
        await asyncio.wait({running}, timeout=limit)
        if running.done():
            return running.result()
        running.cancel()
        await asyncio.wait({running}, timeout=LEFT_BEHIND_S)
        raise TimeLimitError(job.type, limit)

    try:
        value = _on_a_loop(run, loop)
    except KeyboardInterrupt:
        raise  # the test run is being interrupted
    except BaseException as exc:  # as the worker: SystemExit from a handler fails its job
        this_run.finished = True
        if this_run.follow_ups is not None:
            this_run.follow_ups.failed()
        return exc, None
    this_run.finished = True
    follow = this_run.follow_ups
    if follow is None:
        return None, value
    # As in the worker, the job succeeds once Kafka (here, the transport) acknowledged the
    # jobs it enqueued, and fails with the first it refused.
    if not follow.answered_by_now():
        return follow.unanswered(job.id, app.settings), None
    refused = follow.succeeded(app.settings)
    return (refused, None) if refused is not None else (None, value)


class _Running:
    """A run, as an enqueue in its context sees it (:class:`pipeline._followups.RunningJob`)."""

    __slots__ = ("finished", "follow_ups")

    def __init__(self) -> None:
        self.finished = False
        self.follow_ups: FollowUps | None = None


def _innermost(job_type: JobType) -> CallNext:
    """The handler itself: a coroutine awaited, a plain function on a thread of its own."""

    on_thread = False
    """As in the worker, one thread of the run's handler at a time, until its outcome is back
    on the loop (even if the call waiting for it was cancelled)."""

    def back() -> None:
        nonlocal on_thread
        on_thread = False

    async def innermost(call: JobCall) -> Any:
        nonlocal on_thread
        kwargs = handler_kwargs(job_type, call)
        if job_type.is_async:
            return await start_coroutine(job_type, kwargs)
        if on_thread:
            raise plain_function_twice(call.job)
        on_thread = True
        error, result = await _in_thread(job_type.name, job_type.handler, kwargs, back)
        if error is not None:
            # Raised here, not through the future: a future refuses a StopIteration (this
            # coroutine turns one into a RuntimeError, as any coroutine does; so does the worker).
            raise error
        return result

    return innermost


def _in_thread(
    name: str, func: Callable[..., Any], kwargs: dict[str, Any], back: Callable[[], None]
) -> asyncio.Future[tuple[BaseException | None, Any]]:
    """``func(**kwargs)`` on a daemon thread (left to finish alone if its time limit passed):
    (what it raised, or None; what it returned). ``back()`` is called on the loop when it
    returned."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[tuple[BaseException | None, Any]] = loop.create_future()
    context = contextvars.copy_context()

    def settle(error: BaseException | None, result: Any) -> None:
        back()
        if not future.done():  # else cancelled at the time limit
            future.set_result((error, result))

    def main() -> None:
        error: BaseException | None = None
        result: Any = None
        try:
            result = context.run(func, **kwargs)
        except BaseException as exc:
            error = call_error(name, exc)  # judged here, before its traceback grows
        # A run that ended at its time limit has closed its loop: nothing waits for this one.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, error, result)

    threading.Thread(target=main, name=f"pipeline-testing-{name}", daemon=True).start()
    return future


def _on_a_loop(main: Callable[[], Coroutine[Any, Any, T]], loop: BoundedRunner | None) -> T:
    """``main()`` run on ``loop`` (or a fresh one), on a helper thread when this thread runs a
    loop already (an async test).

    It runs in a copy of this thread's ``contextvars`` context, taken now: as a worker's jobs
    each run in a copy of the worker's, what one run sets is not seen by the next one, nor by
    the test (a runner's own context would be shared by every run on it)."""
    context = contextvars.copy_context()

    def run() -> T:
        if loop is not None:
            return loop.run(main(), context=context)
        with BoundedRunner() as fresh:
            return fresh.run(main(), context=context)

    return off_the_loop(run)


def off_the_loop(call: Callable[[], T]) -> T:
    """``call()``, on a helper thread when this thread runs an event loop (an async test):
    what runs or closes a loop of its own cannot run inside another."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return call()
    with ThreadPoolExecutor(1, thread_name_prefix="pipeline-testing") as pool:
        return pool.submit(call).result()
