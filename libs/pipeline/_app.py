"""The application object: job registration and enqueueing (DESIGN section 9)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, cast

from . import _exitflush
from ._dedupstores import DedupStore
from ._delivery import JobHandle
from ._enqueuemany import send_many
from ._envelopes import job_codec
from ._errors import ConfigurationError, PipelineError
from ._failurelog import FailureLog
from ._flush import flush, flush_at_exit, log_with_block
from ._followups import follow_ups, patience, produce_followed
from ._interceptors import Interceptor, check_interceptors, header_source
from ._job import Priority, new_job_id, now_ms
from ._jobfunction import (
    BoundEnqueue,
    ContextJobFunction,
    EnqueueOptions,
    JobFunction,
    Register,
    takes_ctx_first,
)
from ._jobtemplate import JobTemplate
from ._messagesize import enqueue_room, message_max_bytes, too_large
from ._producer import KafkaTransport
from ._records import Schedule
from ._registry import JobOptions, JobType, Registry
from ._route import SHARED_KEY, PlainRoutes, Route, resolve_route
from ._settings import Settings, build_settings
from ._topics import TopicNames
from ._transport import Transport, taken_of
from .outbox._dialect import DEFAULT_TABLE
from .outbox._writer import Outbox, OutboxJob, outbox_route

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

__all__ = ["BoundEnqueue", "EnqueueOptions", "JobFunction", "JobHandle", "Pipeline"]

_NO_OPTIONS = EnqueueOptions()


class Pipeline:
    """A job application: registers handlers with :meth:`job` and enqueues jobs to Kafka.

    ``Pipeline()`` reads :class:`Settings` from the environment and the config file; pass a
    settings object (or keyword overrides) to configure it in code. The Kafka producer is created
    on the first enqueue, so constructing an application (e.g. in a worker) costs nothing.
    ``middleware`` lists interceptors the worker runs around every job (see
    :class:`pipeline.Interceptor`), outermost first.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        transport: Transport | None = None,
        dedup_store: DedupStore | None = None,
        middleware: Iterable[Interceptor] = (),
        **overrides: Any,
    ) -> None:
        if settings is not None and overrides:
            settings = settings.model_copy(update=overrides)
        self.settings = settings if settings is not None else build_settings(**overrides)
        self.topics = TopicNames(self.settings.namespace)
        self.registry = Registry()
        self.codec = job_codec(self.settings)
        self._transport = transport if transport is not None else KafkaTransport(self.settings)
        self.dedup_store = dedup_store
        """Where workers keep idempotency keys; None: the compacted ``<ns>.dedup`` topic."""
        self.middleware = check_interceptors(middleware)
        """Interceptors the worker runs around every job's handler, outermost first."""
        self._header_source = header_source(self.middleware)
        """Headers the interceptors add to every job at enqueue (None: none do, no cost)."""
        self._failures = FailureLog(self._transport)
        add_poll_hook = getattr(self._transport, "add_poll_hook", None)
        if add_poll_hook is not None:  # failed jobs nobody flushes are logged as they fail
            add_poll_hook(partial(self._failures.tell, self.settings))
        self._max_bytes = message_max_bytes(self.settings)
        """The largest job (value and key) the producer sends: a larger one is refused before."""
        # Only a Kafka producer loses what it holds when the process exits; the exit hook keeps
        # such an application alive from its first enqueue on (in-memory ones are not held).
        self._exit_flushed = isinstance(self._transport, KafkaTransport)
        self._watched = not self._exit_flushed
        self._plain = PlainRoutes(
            lambda job_type: self._route(job_type, _NO_OPTIONS, None),
            self.registry.find,
            self.codec,
        )
        self.schedules: dict[str, Schedule] = {}

    def __repr__(self) -> str:
        return (
            f"Pipeline(namespace={self.settings.namespace!r}, "
            f"bootstrap_servers={self.settings.bootstrap_servers!r}, "
            f"job_types={len(self.registry)})"
        )

    # Registration ---------------------------------------------------------------------------

    def job(self, name: str | None = None, **options: Any) -> Register:
        """Register the decorated function as the handler of job type ``name``.

        Options are those of :class:`JobOptions` (``priority``, ``max_attempts``, ``time_limit``,
        ``concurrency``, ``rate_limit``, ``fatal``, ``payload``). The function stays callable as
        before and gains ``.enqueue(...)``, typed with the handler's parameters (``ctx``
        excluded when it comes first). Payloads are validated against the handler's
        annotations (see docs/failures.md, "Payload validation").
        """
        if "priority" in options:
            options["priority"] = Priority.parse(options["priority"])
        try:
            job_options = JobOptions(**options)
        except TypeError as exc:
            raise ConfigurationError(f"bad option for @app.job: {exc}") from None

        def register(func: Callable[..., Any]) -> JobFunction[..., Any]:
            job_name = name or f"{func.__module__}.{func.__qualname__}"
            job_type = JobType(job_name, func, job_options)
            self.registry.add(job_type)
            if takes_ctx_first(func):
                return ContextJobFunction(self, job_type, func)
            return JobFunction(self, job_type, func)

        return cast(Register, register)

    def schedule(self, name: str, *, cron: str, job_type: str, **options: Any) -> Schedule:
        """Register cron schedule ``name``: a ``job_type`` job at every fire of ``cron``.

        Options: ``payload`` (mapping or bytes), ``tz`` (IANA name, default UTC), ``missed``
        (``skip``, ``once`` or ``all``), ``priority``, ``max_attempts`` (not given: the type's
        declared ones at each fire), ``headers``. One that can never fire raises
        :class:`ConfigurationError`. ``pipeline-scheduler --app`` publishes the registered
        schedules to ``<ns>.schedules`` when it takes the lead; :meth:`publish_schedules` now.
        """
        from ._schedule import make_schedule

        registered = self.registry.find(job_type)
        made = make_schedule(
            name,
            cron=cron,
            job_type=job_type,
            registered=registered,
            max_bytes=self._max_bytes,
            **options,
        )
        self.schedules[name] = made
        return made

    def publish_schedules(self, timeout: float = 30.0) -> list[str]:
        """Write the registered schedules to ``<ns>.schedules``; return the names that changed."""
        from ._scheduletable import publish_schedules

        return publish_schedules(self.settings, list(self.schedules.values()), timeout)

    # Enqueueing -----------------------------------------------------------------------------

    def enqueue(
        self,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        wait: bool = False,
        **options: Any,
    ) -> str:
        """Validate, encode and send one job; return its id.

        Options: ``priority``, ``delay`` (seconds or timedelta), ``run_at`` (aware datetime),
        ``key``, ``idempotency_key``, ``tenant``, ``headers``, ``max_attempts``. Without
        ``wait`` the job is acknowledged in the background: :meth:`flush` waits for that and
        raises what failed. With ``wait=True`` this call blocks until Kafka acknowledged the job.
        """
        if wait:
            return self.submit(job_type, payload, **options).wait().job_id
        source = self._header_source
        added = source() if source is not None else None
        if not options and not added:  # the common call: route and template are made once
            self._watch()
            route, template = self._plain.get(job_type)
            return self._send(route, _or_empty(payload), template)
        route = self._route(job_type, EnqueueOptions(**options), added)
        return self._send(route, _or_empty(payload))

    def submit(
        self, job_type: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> JobHandle:
        """Like :meth:`enqueue`, but return a handle to wait on this job's acknowledgement."""
        route = self._route(job_type, EnqueueOptions(**options), self._added_headers())
        handle = JobHandle(self._transport, self.settings, self._failures)
        self._send(route, _or_empty(payload), handle=handle)
        return handle

    def enqueue_many(
        self, job_type: str, payloads: Iterable[Mapping[str, Any]], **options: Any
    ) -> list[str]:
        """Send many jobs of one type with the same options; return their ids in order.

        Routing and options are resolved once for the batch, which makes this the fastest way
        to enqueue. Call :meth:`flush` to wait until Kafka acknowledged all of them. An
        ``idempotency_key`` is refused: every job would carry it, and run once for all.

        A payload that fails validation, or a job larger than the producer sends
        (``message.max.bytes``), raises :class:`PayloadValidationError`: the jobs before it
        are sent, as one enqueue each would have sent them, it and the ones after it are not.
        The error names its index in ``payloads`` (``index``) and carries the ids of the jobs
        sent before it (``enqueued_ids``).
        """
        route = self._route(job_type, EnqueueOptions(**options), self._added_headers())
        if route.idempotency_key is not None:
            # The workers would run the first job and drop the others as its duplicates.
            raise ConfigurationError(SHARED_KEY)
        template = JobTemplate(self.codec, route.job(new_job_id(), b"{}"))
        follow = follow_ups()  # enqueued by a running job: its success waits for these
        return send_many(
            self._transport,
            route,
            template,
            payloads,
            log=self._failures,
            max_bytes=self._max_bytes,
            follow=None if follow is None else (follow, self.poll, patience(self.settings)),
        )

    def outbox(self, connection: Any, *, table: str = DEFAULT_TABLE) -> Outbox:
        """Enqueue jobs in ``connection``'s open transaction (a ``sqlite3`` or ``psycopg`` one).

        The :class:`pipeline.outbox.Outbox` adds each job to the outbox ``table``: it exists
        once the caller commits, and ``pipeline outbox relay`` publishes it (docs/outbox.md).
        """
        return Outbox(connection, self._outboxed, table=table, max_bytes=self._max_bytes)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until Kafka acknowledged every job enqueued before the call (by any thread;
        not the ones enqueued meanwhile).

        Raises :class:`KafkaAuthenticationError` as soon as Kafka refused the credentials,
        :class:`KafkaUnavailableError` when some of those jobs are still unacknowledged after
        ``timeout`` (default: the producer's delivery timeout), and, for the jobs among them
        that failed and that this thread enqueued and was not told of yet, or that no flush
        raised yet, :class:`EnqueueError` (or :class:`KafkaUnavailableError` for jobs Kafka did
        not answer for in time): its ``failures`` and ``failed_ids`` name every one. A flush
        that returns means that every job this thread enqueued before it was acknowledged (or
        its failure was raised to this thread already), and every other one too, unless a
        call was told of its failure (docs/operations.md, "Enqueued jobs at exit").
        """
        if timeout is None:
            timeout = self.settings.producer.delivery_timeout_s + 5
        flush(self._transport, self._failures, self.settings, timeout)

    def poll(self, timeout: float = 0.0) -> int:
        """Serve the delivery reports of enqueued jobs that came, waiting up to ``timeout``
        for the first; return how many were served. A background thread of the producer does
        this twice a second; call it to learn sooner (a worker does, for its jobs'
        follow-ups)."""
        return self._transport.poll(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Flush and release the producer."""
        try:
            self.flush(timeout)
        finally:
            self._transport.close()
            if self.codec.framing is not None:
                self.codec.framing.close()
            _exitflush.unwatch(self)
            self._watched = not self._exit_flushed

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Flush and close; a flush failure raises, unless the body raised (it is logged)."""
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except PipelineError as flush_error:
            log_with_block(flush_error, exc)

    def _flush_at_exit(self) -> None:
        """The interpreter is exiting: flush, then report what never reached Kafka."""
        flush_at_exit(self, self._transport, self._failures)

    # Internals ------------------------------------------------------------------------------

    def _watch(self) -> None:
        """From the first enqueue on, flush at interpreter exit (see :mod:`._exitflush`)."""
        if not self._watched:
            self._watched = True
            _exitflush.watch(self)

    def _added_headers(self) -> Mapping[str, str] | None:
        """What the interceptors add to the headers of a job enqueued now (None: nothing)."""
        source = self._header_source
        return source() if source is not None else None

    def _route(self, job_type: str, opts: EnqueueOptions, added: Mapping[str, str] | None) -> Route:
        """The route of ``opts``; ``added``: headers under the call's own (e.g. trace context)."""
        self._watch()
        registered = self.registry.find(job_type)
        return resolve_route(
            self.settings, self.topics, job_type, opts, registered=registered, added=added
        )

    def _outboxed(
        self, job_type: str, payload: Mapping[str, Any] | None, options: dict[str, Any]
    ) -> OutboxJob:
        """What :meth:`enqueue` would send, with an idempotency key for sure (the outbox's)."""
        route = self._route(job_type, EnqueueOptions(**options), self._added_headers())
        job_id = new_job_id()
        route = outbox_route(route, job_id)
        value = self.codec.encode(route.job(job_id, route.payload_bytes(_or_empty(payload))))
        return OutboxJob(job_id, route.topic, route.key, value)

    def _send(
        self,
        route: Route,
        payload: Mapping[str, Any],
        template: JobTemplate | None = None,
        handle: JobHandle | None = None,
    ) -> str:
        """Produce one job; ``handle`` learns its id before its delivery report can come."""
        data = route.payload_bytes(payload)
        if template is None:
            job_id = new_job_id()
            value = self.codec.encode(route.job(job_id, data))
        else:
            created_at = now_ms()
            job_id = new_job_id.at(created_at)
            value = template.encode(job_id, data, created_at)
        key = route.key
        if len(value) > enqueue_room(self._max_bytes, key):
            raise too_large(
                route.job_type,
                len(value) + len(key or b""),
                self._max_bytes,
                idempotency_key=len(key or b"") if route.idempotency_key is not None else 0,
            )
        log = self._failures
        generation = log.sending()
        plain: Callable[[KafkaError | None, Message], None]
        if handle is not None:
            handle.job_id = job_id
            handle._generation = generation
            plain = handle._on_delivery
        else:
            plain = generation.on_delivery()
        follow = follow_ups()  # enqueued by a running job: its success waits for this one
        try:
            if follow is None:
                self._transport.produce(route.topic, value, key, plain)
            else:
                followed = partial(log.followed, generation) if handle is None else handle._followed
                produce_followed(
                    follow, 1, partial(self._transport.produce, route.topic, value, key),
                    plain=plain, followed=followed, poll=self.poll,
                    patience_s=patience(self.settings),
                )  # fmt: skip
        except BaseException as exc:
            log.not_sent(generation, 1 - taken_of(exc, 1))
            raise
        # Serve delivery callbacks now and then so they never pile up in librdkafka's queue (a
        # busy producer's: the producer's polling thread stays out of the way while this serves).
        if not generation.sent % 1000:
            self._transport.poll(0)
        return job_id


def _or_empty(payload: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return {} if payload is None else payload  # not `or {}`: [] or "" is refused, not sent
