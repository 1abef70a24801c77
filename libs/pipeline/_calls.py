"""Calling a job's handler: the interceptor chain around it, its keyword arguments, and the one
``TypeError`` that means the payload does not fit the handler.

The worker (with its runners and thread pool) and :mod:`pipeline.testing` build their calls
from these pieces, so an interceptor, a ``ctx`` parameter and a bad payload behave the same
in a test as in production.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._errors import DecodeError, PayloadValidationError
from ._interceptors import CallNext, Interceptor, JobCall

if TYPE_CHECKING:
    from ._job import Job
    from ._registry import JobType


def compose(interceptors: Sequence[Interceptor], innermost: CallNext) -> CallNext:
    """One ``next`` that runs ``interceptors`` (outermost first) around ``innermost``.

    With interceptors, what leaves the chain is checked: an awaitable (an interceptor that
    returned ``next(call)`` without awaiting it) fails the job instead of passing for its result.
    """
    if not interceptors:
        return innermost
    call = innermost
    for interceptor in reversed(interceptors):
        call = _link(interceptor.intercept, call)
    return _checked(call)


def _checked(chain: CallNext) -> CallNext:
    async def run(call: JobCall) -> Any:
        result = await chain(call)
        if inspect.isawaitable(result):
            raise _unawaited(result)
        return result

    return run


def _unawaited(result: Any) -> TypeError:
    """The error of a chain that returned an awaitable; it is closed (a coroutine) or cancelled
    (a future), so the handler does not run behind the job's back."""
    if inspect.iscoroutine(result):
        result.close()
    elif isinstance(result, asyncio.Future):
        result.cancel()
    return TypeError(
        f"an interceptor returned {type(result).__name__} {result!r} instead of a result, so the "
        "handler's run was not awaited: write `return await next(call)`"
    )


def _link(intercept: Callable[[JobCall, CallNext], Any], inner: CallNext) -> CallNext:
    def step(call: JobCall) -> Any:
        return intercept(call, inner)

    return step


def handler_kwargs(job_type: JobType, call: JobCall) -> dict[str, Any]:
    """The keyword arguments ``job_type``'s handler is called with: the call's, and ``ctx`` if
    it declares one."""
    kwargs = dict(call.kwargs)
    if job_type.wants_ctx:
        kwargs["ctx"] = call.ctx
    return kwargs


def codec_failure(job_type: str, exc: Exception, payload: bytes) -> DecodeError:
    """The :class:`DecodeError` a job fails with when its payload codec or validator raised
    something else than a ``DecodeError`` or ``PayloadValidationError`` (a bug of its own)."""
    reason = f"the payload codec of {job_type!r} failed: {type(exc).__name__}: {exc}"
    return DecodeError(reason, payload)


def is_call_error(exc: BaseException) -> bool:
    """Whether a TypeError was raised by the call itself (bad arguments), not inside the body.

    An argument mismatch is raised before the handler's frame exists, so the traceback holds
    only the caller's frame; anything raised inside the handler has more frames.
    """
    tb = exc.__traceback__
    return isinstance(exc, TypeError) and tb is not None and tb.tb_next is None


def call_error(job_type: str, exc: BaseException) -> BaseException:
    """What a handler's call failed with: a :class:`PayloadValidationError` (chained) when the
    call itself refused the payload's arguments, else ``exc`` as it is."""
    if not is_call_error(exc):
        return exc
    error = PayloadValidationError(job_type, str(exc))
    error.__cause__ = exc
    return error


def start_coroutine(job_type: JobType, kwargs: dict[str, Any]) -> Awaitable[Any]:
    """The coroutine of a call of ``job_type``'s coroutine handler; a call that does not fit the
    payload raises :class:`PayloadValidationError` here, before anything of the handler ran."""
    try:
        return job_type.handler(**kwargs)  # type: ignore[no-any-return]
    except TypeError as exc:
        error = call_error(job_type.name, exc)
        if error is exc:
            raise
        raise error from exc


def plain_function_twice(job: Job) -> RuntimeError:
    """The error of an interceptor's ``next(call)`` made while the job's plain-function
    handler still runs on its thread: a plain function runs once at a time (a second run would
    share the first's record, and the first's chain would wait for its thread for ever)."""
    return RuntimeError(
        f"an interceptor called next() for job {job.id} ({job.type}) while its plain-function "
        "handler was still running: a plain function runs once at the same time; await one "
        "next(call) before calling it again"
    )
