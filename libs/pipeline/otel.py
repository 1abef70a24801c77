"""OpenTelemetry tracing for jobs, from the `otel` extra (docs/worker.md, "Tracing").

One line turns it on, for the producer and the worker alike::

    from pipeline.otel import TracingInterceptor

    app = Pipeline(middleware=[TracingInterceptor()])

At enqueue the application then writes the caller's W3C trace context (``traceparent``,
``tracestate``) into the job's headers; the worker runs each attempt of the job in a span that
continues that trace. A retry and a dead letter keep the job's headers, so every attempt and a
replay from the dead-letter topic belong to the trace that enqueued the job. Jobs a handler
enqueues are children of its attempt's span.

OpenTelemetry is imported when a :class:`TracingInterceptor` is made, never by ``pipeline``
itself: an application without it pays nothing at enqueue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from ._interceptors import CallNext, JobCall
from ._retry import Retry

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Span, TracerProvider

__all__ = ["TracingInterceptor"]

_INSTALL = "pip install 'kafka-pipeline[otel]'"


class TracingInterceptor:
    """A span per job attempt in the worker; the trace context in every job enqueued.

    ``tracer_provider``: where the spans go (default: the global one, set with
    ``opentelemetry.trace.set_tracer_provider``). ``propagator``: how the context is written
    to and read from the headers (default: the global one, W3C trace context and baggage).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        try:
            from opentelemetry import propagate, trace
        except ImportError as exc:
            raise ConfigurationError(
                f"pipeline.otel.TracingInterceptor needs OpenTelemetry, which is not installed: "
                f"{_INSTALL}"
            ) from exc
        self._trace = trace
        self._tracer = trace.get_tracer("pipeline", tracer_provider=tracer_provider)
        self._inject = propagator.inject if propagator is not None else propagate.inject
        self._extract = propagator.extract if propagator is not None else propagate.extract
        self._consumer = trace.SpanKind.CONSUMER

    def enqueue_headers(self) -> Mapping[str, str]:
        """The current trace context as headers (none outside a span)."""
        carrier: dict[str, str] = {}
        self._inject(carrier)
        return carrier

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        """Run the attempt in a span: child of the context in the job's headers."""
        job, ctx = call.job, call.ctx
        parent = self._extract(job.headers) if job.headers else None
        attributes: dict[str, str | int | bool] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": ctx.topic,
            "messaging.destination.partition.id": str(ctx.partition),
            "messaging.kafka.message.offset": ctx.offset,
            "messaging.message.id": job.id,
            "pipeline.job.type": job.type,
            "pipeline.job.id": job.id,
            "pipeline.job.attempt": job.attempt,
            "pipeline.job.max_attempts": job.max_attempts,
        }
        if job.tenant is not None:
            attributes["pipeline.job.tenant"] = job.tenant
        with self._tracer.start_as_current_span(
            f"pipeline.job {job.type}",
            context=parent,
            kind=self._consumer,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                result = await next(call)
            except Retry as exc:
                span.set_attribute("pipeline.job.outcome", "retry")
                span.add_event("retry requested", {"pipeline.retry.reason": str(exc)})
                raise
            except BaseException as exc:  # CancelledError: the time limit or a shutdown
                self._failed(span, exc)
                raise
            span.set_attribute("pipeline.job.outcome", "succeeded")
            return result

    def _failed(self, span: Span, exc: BaseException) -> None:
        cancelled = not isinstance(exc, Exception)
        span.set_attribute("pipeline.job.outcome", "cancelled" if cancelled else "failed")
        span.record_exception(exc)
        description = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description))
