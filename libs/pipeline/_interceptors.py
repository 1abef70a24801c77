"""Interceptors: code that runs around every job's handler, in the worker (docs/worker.md).

An interceptor is an object with ``async def intercept(self, call, next)``. ``call`` is a
:class:`JobCall` (the job, its context, the registered job type and the decoded keyword
arguments); ``next(call)`` runs the rest of the chain and, innermost, the handler, and returns
what the handler returned. An interceptor may do work before and after, pass on a changed call
(``dataclasses.replace(call, kwargs=...)``), return without calling ``next`` (the job succeeds
without running its handler), or raise: what leaves the chain is classified exactly like an
error of the handler itself (``Retry``, an error declared fatal, any other: transient).

They are registered on the application, ``Pipeline(middleware=[...])``, outermost first, so
``pipeline-worker --app`` runs them. An interceptor may also define ``enqueue_headers(self)``,
returning headers to add to each job the application enqueues, read in the enqueuing code's
context (e.g. the W3C trace context, :mod:`pipeline.otel`); headers given to the enqueue call
win over them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ._errors import ConfigurationError

if TYPE_CHECKING:
    from ._context import JobContext
    from ._job import Job
    from ._registry import JobType

__all__ = ["CallNext", "Interceptor", "JobCall"]


@dataclass(frozen=True, slots=True)
class JobCall:
    """One call of a job's handler, as an interceptor sees it."""

    job: Job
    """The job (id, type, attempt, tenant, headers...)."""
    ctx: JobContext
    """Its context (the same object a handler with a ``ctx`` parameter receives)."""
    handler: JobType
    """The registered job type: its name, handler function and options."""
    kwargs: Mapping[str, Any]
    """The decoded payload, as the handler's keyword arguments (``ctx`` not included)."""
    run: Any = field(default=None, repr=False, compare=False)
    """The worker's record of this run (opaque; ``dataclasses.replace`` carries it along)."""


CallNext = Callable[[JobCall], Awaitable[Any]]
"""``await next(call)``: run the rest of the chain and the handler; returns its result."""


class Interceptor(Protocol):
    """Runs around every job's handler; see the module docstring."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        """Run the job: ``return await next(call)``, with whatever you need around it."""
        ...


def check_interceptors(middleware: Iterable[object]) -> tuple[Interceptor, ...]:
    """The interceptors as a tuple; ConfigurationError for one without an async ``intercept``."""
    checked: list[Interceptor] = []
    for item in middleware:
        intercept = getattr(item, "intercept", None)
        if not inspect.iscoroutinefunction(intercept):
            raise ConfigurationError(
                f"Pipeline(middleware=...): {item!r} is not an interceptor; give it a method "
                "`async def intercept(self, call, next)` that returns `await next(call)`"
            )
        checked.append(item)  # type: ignore[arg-type]
    return tuple(checked)


HeaderSource = Callable[[], Mapping[str, str]]
"""Headers to add to a job at enqueue, read in the enqueuing code's context."""


def header_source(interceptors: Iterable[object]) -> HeaderSource | None:
    """The interceptors' ``enqueue_headers`` as one callable; None when none has one (then an
    enqueue does no work for them)."""
    sources: list[HeaderSource] = [
        source
        for item in interceptors
        if callable(source := getattr(item, "enqueue_headers", None))
    ]
    if not sources:
        return None
    if len(sources) == 1:
        return sources[0]

    def merged() -> Mapping[str, str]:
        headers: dict[str, str] = {}
        for source in sources:
            headers.update(source())
        return headers

    return merged
