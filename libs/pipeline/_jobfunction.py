"""What ``@app.job`` returns: the handler, still callable, with a typed ``.enqueue``.

``.enqueue`` takes the handler's own parameters (a ``ParamSpec``), so mypy checks a call against
the handler's signature. A ``ctx`` parameter is not part of the payload: declared first, it is
dropped from ``.enqueue``'s signature by the ``Concatenate`` overload; declared anywhere else,
only the ``pipeline.mypy`` plugin drops it (``Concatenate`` removes leading parameters only).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from ._context import JobContext
from ._errors import ConfigurationError
from ._job import MAX_ATTEMPTS, Priority
from ._registry import JobType, Registry


class Enqueuer(Protocol):
    """What a registered handler enqueues through: its application (:class:`pipeline.Pipeline`)."""

    @property
    def registry(self) -> Registry: ...

    def enqueue(
        self,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        wait: bool = False,
        **options: Any,
    ) -> str: ...

    def enqueue_many(
        self, job_type: str, payloads: Iterable[Mapping[str, Any]], **options: Any
    ) -> list[str]: ...


P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True, kw_only=True)
class EnqueueOptions:
    """How one enqueue call routes its jobs; ``None`` falls back to the job type's options."""

    priority: Priority | str | None = None
    delay: float | timedelta | None = None
    run_at: datetime | None = None
    key: str | bytes | None = None
    idempotency_key: str | None = None
    tenant: str | None = None
    headers: Mapping[str, str] | None = None
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        """Refuse a mistyped option, naming it, not as a failure deep in the job's encoding."""
        for name, types, what in _OPTION_TYPES:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
                raise ConfigurationError(f"{name} must be {what}, got {value!r}")
        if self.max_attempts is not None and self.max_attempts > MAX_ATTEMPTS:
            raise ConfigurationError(
                f"max_attempts must be at most {MAX_ATTEMPTS}, got {self.max_attempts}"
            )
        headers = self.headers
        if headers is not None:
            bad = _not_a_string_map(headers)
            if bad is not None:
                raise ConfigurationError(f"headers must map strings to strings, got {bad}")


_OPTION_TYPES: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("delay", (int, float, timedelta), "a number of seconds or a timedelta"),
    ("run_at", (datetime,), "a datetime"),
    ("key", (str, bytes), "a str or bytes"),
    ("idempotency_key", (str,), "a str"),
    ("tenant", (str,), "a str"),
    ("max_attempts", (int,), "an int"),
)
"""Enqueue options whose type is checked: name, the types taken, how a message says them."""


def _not_a_string_map(headers: object) -> str | None:
    """What in ``headers`` is not a string mapped to a string (None: nothing)."""
    if not isinstance(headers, Mapping):
        return repr(headers)
    for name, value in headers.items():
        if not isinstance(name, str) or not isinstance(value, str):
            return f"{name!r}: {value!r}"
    return None


class JobFunction(Generic[P, R]):
    """A registered handler: call it like the original function, or ``.enqueue(**payload)``."""

    def __init__(self, app: Enqueuer, job_type: JobType, func: Callable[..., R]) -> None:
        self.app = app
        self.job_type = job_type
        self._func = func
        self.__doc__ = func.__doc__
        self.__name__ = getattr(func, "__name__", job_type.name)
        self.__wrapped__ = func

    @property
    def name(self) -> str:
        return self.job_type.name

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._func(*args, **kwargs)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue a job of this type with the handler's arguments as its payload."""
        return self.app.enqueue(self.job_type.name, self.job_type.payload_of(args, kwargs))

    def with_options(self, **options: Any) -> BoundEnqueue[P]:
        """Fix routing options: ``.with_options(priority="high", delay=30).enqueue(...)``."""
        EnqueueOptions(**options)  # fail fast on a misspelled option
        return BoundEnqueue(self.app, self.job_type.name, options)

    def __repr__(self) -> str:
        return f"<job {self.job_type.name!r} -> {self._func!r}>"


class ContextJobFunction(JobFunction[P, R]):
    """A handler whose first parameter is ``ctx``: ``.enqueue`` takes the parameters after it."""

    if TYPE_CHECKING:
        # The handler itself still takes ctx first (at run time the base's __call__ passes
        # any arguments through, ctx=... included).
        def __call__(  # type: ignore[override]
            self, ctx: JobContext, /, *args: P.args, **kwargs: P.kwargs
        ) -> R: ...


class Register(Protocol):
    """The decorator ``@app.job(...)`` returns."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[JobContext, P], R]
    ) -> ContextJobFunction[P, R]: ...

    @overload
    def __call__(self, func: Callable[P, R]) -> JobFunction[P, R]: ...


@dataclass(frozen=True, slots=True)
class BoundEnqueue(Generic[P]):
    """A job type with enqueue options fixed; made by :meth:`JobFunction.with_options`."""

    app: Enqueuer
    job_type: str
    options: Mapping[str, Any]

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        payload = self.app.registry.get(self.job_type).payload_of(args, kwargs)
        return self.app.enqueue(self.job_type, payload, **self.options)

    def enqueue_many(self, payloads: Iterable[Mapping[str, Any]]) -> list[str]:
        return self.app.enqueue_many(self.job_type, payloads, **self.options)


def takes_ctx_first(func: Callable[..., Any]) -> bool:
    """Whether ``func``'s first parameter is ``ctx`` (the job context, not a payload field)."""
    try:
        first = next(iter(inspect.signature(func).parameters), None)
    except (TypeError, ValueError):
        return False
    return first == "ctx"
