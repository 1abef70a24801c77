"""How a job of one enqueue call is routed: its topic, key and the fields every job of it shares."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ._codec import JobCodec, PayloadCodec
from ._errors import ConfigurationError, PayloadValidationError
from ._job import Job, PayloadEncoding, Priority, delay_s, due_at_ms, due_in_ms, new_job_id
from ._jobfunction import EnqueueOptions
from ._jobtemplate import JobTemplate
from ._jsonpayload import JSON
from ._registry import JobOptions, JobType
from ._settings import Settings
from ._topics import TopicNames

_MAX_PLAIN = 1024
"""Job types whose plain route :class:`PlainRoutes` keeps (past that it starts over)."""
_TYPE_DEFAULTS = JobOptions()
"""The options of a job type nobody registered in this process (made once: it is frozen)."""
SHARED_KEY = (
    "one idempotency key for every job of enqueue_many would run only the first of them (the "
    "others are its duplicates): enqueue each job with a key of its own "
    "(app.enqueue(..., idempotency_key=...)), or use key= to keep their order"
)
"""Why a batch (``enqueue_many``, the outbox's too) refuses an ``idempotency_key``."""


@dataclass(frozen=True, slots=True)
class PayloadRoute:
    """How the payloads of one job type are checked and encoded, by an enqueue (its
    :class:`Route`) and by a schedule of the type alike."""

    job_type: str
    registered: JobType | None
    payload_codec: PayloadCodec
    check: Callable[[Mapping[str, Any], bytes], None] | None
    """Checks the encoded payload against the handler's annotations; None: nothing to check."""

    @classmethod
    def of(cls, job_type: str, registered: JobType | None) -> PayloadRoute:
        """``job_type``'s, with the payload codec and the checks of ``registered`` (None: a
        type this application does not know, JSON unchecked)."""
        if registered is None:
            return cls(job_type, None, JSON, None)
        codec = registered.codec
        return cls(job_type, registered, codec, registered.encoded_check(codec))

    def payload_bytes(self, payload: Mapping[str, Any]) -> bytes:
        """``payload`` validated (the handler's signature and annotations) and encoded."""
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise PayloadValidationError(
                self.job_type, f"payload must be a mapping, got {type(payload).__name__}"
            )
        registered = self.registered
        codec = self.payload_codec
        json = codec.encoding is PayloadEncoding.JSON
        if registered is not None and json:
            registered.check_payload(payload)
        payload_bytes = codec.encode(self.job_type, payload)
        if registered is not None and not json:
            payload = registered.as_handled(codec, payload, payload_bytes)
            registered.check_payload(payload)
        if self.check is not None:
            self.check(payload, payload_bytes)
        return payload_bytes


@dataclass(frozen=True, slots=True)
class Route(PayloadRoute):
    """Where and how the jobs of one enqueue call go, resolved once for all of them."""

    topic: str
    key: bytes | None
    priority: Priority
    max_attempts: int
    not_before: int | None
    idempotency_key: str | None
    tenant: str | None
    headers: dict[str, str]

    def job(self, job_id: str, payload: bytes) -> Job:
        """A new job of this route."""
        return Job(
            id=job_id,
            type=self.job_type,
            payload=payload,
            payload_encoding=self.payload_codec.encoding,
            priority=self.priority,
            max_attempts=self.max_attempts,
            not_before=self.not_before,
            idempotency_key=self.idempotency_key,
            tenant=self.tenant,
            headers=self.headers.copy() if self.headers else {},
        )


def not_before_ms(delay: float | timedelta | None, run_at: datetime | None) -> int | None:
    """The due time of ``delay`` or ``run_at`` in the wire's milliseconds; None: neither."""
    if delay is not None and run_at is not None:
        raise ConfigurationError("give either delay or run_at, not both")
    if delay is not None:
        try:
            seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
            return due_in_ms(delay_s(seconds, "delay"))
        except OverflowError:
            raise ConfigurationError("delay is too large (seconds, as a number)") from None
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
    if run_at is not None:
        if run_at.utcoffset() is None:  # naive, or a tzinfo that gives no offset
            raise ConfigurationError("run_at must be timezone-aware (e.g. datetime.now(UTC))")
        return due_at_ms(run_at)
    return None


def resolve_route(
    settings: Settings,
    topics: TopicNames,
    job_type: str,
    opts: EnqueueOptions,
    *,
    registered: JobType | None,
    added: Mapping[str, str] | None,
) -> Route:
    """The route of ``opts`` for ``job_type`` (``registered``: its handler's type, if any);
    ``added``: headers under the call's own (e.g. trace context)."""
    if not job_type.strip():
        raise ConfigurationError("a job type must not be empty or blank")
    if opts.idempotency_key is not None and not opts.idempotency_key.strip():
        # Most likely an unset variable: every such job would be a duplicate of the first.
        raise ConfigurationError(
            "an idempotency key must not be empty or blank (pass None for a job without one)"
        )
    type_options = registered.options if registered is not None else _TYPE_DEFAULTS
    priority = Priority.parse(opts.priority) if opts.priority is not None else type_options.priority
    max_attempts = next(
        value
        for value in (
            opts.max_attempts,
            type_options.max_attempts,
            settings.producer.default_max_attempts,
        )
        if value is not None
    )
    if max_attempts < 1:
        raise ConfigurationError(f"max_attempts must be at least 1, got {max_attempts}")
    not_before = not_before_ms(opts.delay, opts.run_at)
    # Due after the current millisecond, rounded up as due times are: a delay of 0 is due now
    # and needs no scheduler to release it.
    topic = (
        topics.deferred
        if not_before is not None and not_before > due_in_ms(0)
        else topics.jobs(priority)
    )
    # The partition key: the idempotency key when present (every duplicate then lands on
    # one partition), else the explicit key, else none (librdkafka spreads the jobs).
    if opts.idempotency_key is not None:
        key: bytes | None = _utf8(opts.idempotency_key, "an idempotency key")
    else:
        key = _utf8(opts.key, "a key") if isinstance(opts.key, str) else opts.key
    payloads = PayloadRoute.of(job_type, registered)
    return Route(
        job_type=job_type,
        registered=registered,
        payload_codec=payloads.payload_codec,
        check=payloads.check,
        topic=topic,
        key=key,
        priority=priority,
        max_attempts=max_attempts,
        not_before=not_before,
        idempotency_key=opts.idempotency_key,
        tenant=opts.tenant,
        headers={**(added or {}), **(opts.headers or {})},
    )


def _utf8(text: str, what: str) -> bytes:
    """``text`` as the message key: UTF-8, which a lone surrogate (as ``os.fsdecode`` makes of
    undecodable bytes) is not."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise ConfigurationError(
            f"{what} must be text that UTF-8 can encode: {text[exc.start : exc.end]!r} at "
            f"position {exc.start} is a lone surrogate (decode the bytes it came from properly, "
            "or pass a digest of them)"
        ) from None


class PlainRoutes:
    """The route and job template of each job type enqueued without options, made once.

    ``enqueue(type, payload)`` then costs what a job of ``enqueue_many`` costs: a payload, an id
    and a template fill, not the options resolved and the envelope encoded again. A route made
    before its type was registered (or registered again) is made again.
    """

    __slots__ = ("_codec", "_find", "_made", "_make")

    def __init__(
        self,
        make: Callable[[str], Route],
        find: Callable[[str], JobType | None],
        codec: JobCodec,
    ) -> None:
        self._make = make
        self._find = find
        self._codec = codec
        self._made: dict[str, tuple[Route, JobTemplate]] = {}

    def get(self, job_type: str) -> tuple[Route, JobTemplate]:
        made = self._made.get(job_type)
        if made is None or made[0].registered is not self._find(job_type):
            route = self._make(job_type)
            if len(self._made) >= _MAX_PLAIN:
                self._made.clear()  # types named on the fly: keep memory bounded
            template = JobTemplate(self._codec, route.job(new_job_id(), b"{}"))
            made = self._made[job_type] = (route, template)
        return made
