"""Job types: a handler, its name and its per-type options, collected in a registry."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._dedup import DedupMode, DedupPolicy
from ._errors import (
    ConfigurationError,
    DecodeError,
    PayloadValidationError,
    UnknownJobTypeError,
)
from ._job import MAX_ATTEMPTS, PayloadEncoding, Priority
from ._jsonpayload import JSON
from ._payloadcheck import PayloadModel, payload_model
from ._retry import Backoff

if TYPE_CHECKING:
    from ._codec import PayloadCodec


RATE_MIN = 1e-6
"""The lowest ``rate_limit`` (runs per second, about one in 11.6 days): a smaller one rounds
to a share of 0 in a worker, and its jobs would never start."""
RATE_MAX = 1e9
"""The highest ``rate_limit``: a larger one is no limit, and its token bucket would overflow."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOptions:
    """Per-type options given to ``@app.job(name, **options)``.

    ``None`` means "use the setting's default" wherever a setting exists.
    """

    priority: Priority = Priority.DEFAULT
    max_attempts: int | None = None
    time_limit: float | None = None
    """Seconds a run may take; past it the job fails with a timeout (async tasks are cancelled)."""
    concurrency: int | None = None
    """At most this many runs of the type at once in one worker process."""
    rate_limit: float | None = None
    """Runs per second across the whole fleet (each worker takes its partitions' share)."""
    fatal: tuple[type[BaseException], ...] = ()
    """Exceptions that go straight to the dead-letter topic instead of being retried."""
    payload: PayloadCodec | None = None
    """How payloads are encoded: ``None`` is JSON; ``AvroPayload(schema)`` for Avro."""
    backoff: Backoff = field(default_factory=Backoff)
    """Delay before each retry of a transient failure."""
    dedup: str = "until_complete"
    """How a job with an idempotency key keeps its duplicates out: ``until_complete`` or
    ``until_ttl`` (see docs/idempotency.md)."""
    dedup_ttl: float | None = None
    """Seconds a key is held; None: the ``worker.dedup_ttl_s`` setting (an hour)."""

    def __post_init__(self) -> None:
        # "high" as well as Priority.HIGH; anything else names the four (UnknownPriorityError)
        object.__setattr__(self, "priority", Priority.parse(self.priority))
        self._check_kinds()
        for name in ("max_attempts", "concurrency"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {value}")
        if self.max_attempts is not None and self.max_attempts > MAX_ATTEMPTS:
            # The wire's attempt count is an Avro int: every enqueue would fail to encode.
            raise ConfigurationError(
                f"max_attempts must be at most {MAX_ATTEMPTS}, got {self.max_attempts}"
            )
        if self.time_limit is not None and not 0 < self.time_limit < math.inf:
            raise ConfigurationError(f"time_limit must be positive, got {self.time_limit}")
        if self.rate_limit is not None and not RATE_MIN <= self.rate_limit <= RATE_MAX:
            raise ConfigurationError(
                f"rate_limit must be from {RATE_MIN:g} to {RATE_MAX:g} runs per second, "
                f"got {self.rate_limit}"
            )
        if isinstance(self.fatal, type):
            object.__setattr__(self, "fatal", (self.fatal,))
        else:
            object.__setattr__(self, "fatal", tuple(self.fatal))
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in self.fatal):
            raise ConfigurationError(f"fatal must name exception classes, got {self.fatal!r}")
        try:
            object.__setattr__(self, "dedup", DedupMode(self.dedup))
        except ValueError:
            modes = ", ".join(m.value for m in DedupMode)
            raise ConfigurationError(f"dedup must be one of {modes}, got {self.dedup!r}") from None
        self.dedup_policy(3600.0)  # validates dedup_ttl; the real default is a setting

    def _check_kinds(self) -> None:
        """Each option of the kind it must be: a wrong one would fail later, in the worker."""
        for name in ("max_attempts", "concurrency"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"{name} must be a whole number, got {value!r}")
        for name in ("time_limit", "rate_limit", "dedup_ttl"):
            value = getattr(self, name)
            number = isinstance(value, float | int) and not isinstance(value, bool)
            if value is not None and not number:
                raise ConfigurationError(f"{name} must be a number, got {value!r}")
        if not isinstance(self.backoff, Backoff):
            # Anything else failed at the job's first failure, and its offset stayed unfinished.
            raise ConfigurationError(
                f"backoff must be a Backoff (pipeline.Backoff(base_s=..., ...)), got "
                f"{self.backoff!r}"
            )

    def dedup_policy(self, default_ttl_s: float) -> DedupPolicy:
        """The type's deduplication, with ``default_ttl_s`` where it names no TTL."""
        ttl = self.dedup_ttl if self.dedup_ttl is not None else default_ttl_s
        return DedupPolicy(DedupMode(self.dedup), ttl)


@dataclass(frozen=True, slots=True)
class JobType:
    """A registered job type: its handler and how to call it."""

    name: str
    handler: Callable[..., Any]
    options: JobOptions = field(default_factory=JobOptions)
    is_async: bool = field(init=False)
    wants_ctx: bool = field(init=False)
    _signature: inspect.Signature = field(init=False, repr=False)
    _required: frozenset[str] = field(init=False, repr=False)
    _allowed: frozenset[str] | None = field(init=False, repr=False)
    """Keyword names the handler takes; ``None`` when it takes ``**kwargs``."""
    _positional: tuple[str, ...] = field(init=False, repr=False)
    """Payload fields a positional argument of ``.enqueue`` fills, in order."""
    model: PayloadModel | None = field(init=False, repr=False)
    """Validates payloads against the handler's annotations; ``None``: none are annotated."""

    def __post_init__(self) -> None:
        signature = inspect.signature(self.handler)
        params = {n: p for n, p in signature.parameters.items() if n != "ctx"}
        keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        required = {n for n, p in params.items() if p.kind in keyword and p.default is p.empty}
        var_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        allowed = None if var_keyword else {n for n, p in params.items() if p.kind in keyword}
        if any(
            p.kind is inspect.Parameter.POSITIONAL_ONLY and p.default is p.empty
            for p in params.values()
        ):
            # No payload can fill a required positional-only parameter: let bind say so.
            required.add("")
        object.__setattr__(self, "_signature", signature)
        object.__setattr__(self, "_required", frozenset(required))
        object.__setattr__(self, "_allowed", None if allowed is None else frozenset(allowed))
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.handler))
        object.__setattr__(self, "wants_ctx", "ctx" in signature.parameters)
        object.__setattr__(
            self,
            "_positional",
            tuple(
                n for n, p in params.items() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            ),
        )
        object.__setattr__(self, "model", payload_model(self.name, self.handler))

    def payload_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """The payload of ``.enqueue(*args, **kwargs)``: positional arguments fill the fields
        the handler takes by position (``ctx`` excluded), in order."""
        if not args:
            return kwargs
        if len(args) > len(self._positional):
            raise PayloadValidationError(
                self.name,
                f"takes {len(self._positional)} positional payload argument(s), {len(args)} given",
            )
        payload = dict(zip(self._positional, args, strict=False))
        for name in kwargs:
            if name in payload:
                raise PayloadValidationError(self.name, f"got multiple values for {name!r}")
        payload.update(kwargs)
        return payload

    def load_payload(self, codec: PayloadCodec, data: bytes) -> dict[str, Any]:
        """The handler's keyword arguments from a job's payload bytes: decoded, validated.

        Raises :class:`DecodeError` or :class:`PayloadValidationError`.
        """
        model = self.model
        if model is None:
            return codec.decode(self.name, data)
        if codec.encoding is PayloadEncoding.JSON:
            return model.check_json(data)  # parses and validates in one pass
        return model.check(codec.decode(self.name, data))

    @property
    def codec(self) -> PayloadCodec:
        """The payload codec the type declares, else JSON's."""
        return self.options.payload or JSON

    def payload_loader(self, codec: PayloadCodec) -> Callable[[bytes], dict[str, Any]]:
        """:meth:`load_payload` with ``codec`` bound, one call deep for a validated JSON payload
        (the worker keeps one per job type)."""
        if self.model is not None and codec.encoding is PayloadEncoding.JSON:
            return self.model.check_json
        return functools.partial(self.load_payload, codec)

    def payload_loaders(
        self, codec: PayloadCodec
    ) -> dict[PayloadEncoding, Callable[[bytes], dict[str, Any]]]:
        """A :meth:`payload_loader` for each encoding a job's envelope may state: ``codec``'s
        for its own; JSON's for a JSON payload of a type whose codec is another (jobs written
        before the type moved to Avro, still on a retry or deferred topic); for any other, one
        that raises :class:`DecodeError` naming both (no schema reads Avro bytes as JSON)."""
        loaders: dict[PayloadEncoding, Callable[[bytes], dict[str, Any]]] = {
            label: functools.partial(_mislabelled, self.name, label, codec.encoding)
            for label in PayloadEncoding
        }
        loaders[PayloadEncoding.JSON] = self.payload_loader(JSON)
        loaders[codec.encoding] = self.payload_loader(codec)
        return loaders

    def encoded_check(
        self, codec: PayloadCodec
    ) -> Callable[[Mapping[str, Any], bytes], None] | None:
        """What checks an encoded payload of this type at enqueue (it raises
        :class:`PayloadValidationError`); ``None`` when the handler annotates nothing."""
        if self.model is None:
            return None
        return self.model.encoded_check(codec.encoding is PayloadEncoding.JSON)

    def as_handled(
        self, codec: PayloadCodec, payload: Mapping[str, Any], data: bytes
    ) -> Mapping[str, Any]:
        """``payload``, encoded as ``data``, as the worker hands it to the handler: itself for
        JSON, else ``data`` decoded (an Avro schema's defaults filled in, its enums and logical
        types as read), which is what enqueue must check."""
        if codec.encoding is PayloadEncoding.JSON:
            return payload
        decoded: Mapping[str, Any] = codec.decode(self.name, data)
        return decoded

    def check_payload(self, payload: Mapping[str, Any]) -> None:
        """Raise :class:`PayloadValidationError` when ``payload`` cannot be the handler's kwargs."""
        # Set arithmetic answers the common case in a fraction of Signature.bind's time; bind
        # runs only to word the error (or for signatures sets cannot judge).
        names = payload.keys()
        if self._required <= names and (self._allowed is None or self._allowed >= names):
            return
        try:
            if self.wants_ctx:
                self._signature.bind(**payload, ctx=None)
            else:
                self._signature.bind(**payload)
        except TypeError as exc:
            raise PayloadValidationError(self.name, str(exc)) from None


class Registry:
    """The job types an application knows, by name."""

    def __init__(self) -> None:
        self._types: dict[str, JobType] = {}

    def add(self, job_type: JobType) -> None:
        existing = self._types.get(job_type.name)
        if existing is not None and existing.handler is not job_type.handler:
            raise ConfigurationError(
                f"job type {job_type.name!r} is already registered to {existing.handler!r}"
            )
        self._types[job_type.name] = job_type

    def get(self, name: str) -> JobType:
        try:
            return self._types[name]
        except KeyError:
            raise UnknownJobTypeError(name) from None

    def find(self, name: str) -> JobType | None:
        return self._types.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self) -> Iterator[JobType]:
        return iter(self._types.values())

    def __len__(self) -> int:
        return len(self._types)


def _mislabelled(
    name: str, label: PayloadEncoding, reads: PayloadEncoding, data: bytes
) -> dict[str, Any]:
    raise DecodeError(
        f"the payload of this {name} job is {label.value}, and job type {name!r} reads "
        f"{reads.value} payloads",
        data,
    )
