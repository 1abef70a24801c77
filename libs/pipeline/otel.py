"""OpenTelemetry tracing for jobs, from the `otel` extra (docs/worker.md, "Tracing").

One line turns it on, for the producer and the worker alike::

    from pipeline.otel import TracingInterceptor

    app = Pipeline(middleware=[TracingInterceptor()])

At enqueue the application then writes the caller's W3C trace context (``traceparent``,
``tracestate``) into the job's headers; the worker runs each attempt of the job in a span that
continues that trace; a job without one starts a trace of its own (it is never a child of
whatever span is current in the worker). A retry and a dead letter keep the job's headers, so
every attempt and a replay from the dead-letter topic belong to the trace that enqueued the job.
Jobs a handler enqueues are children of its attempt's span.

What a failure puts on a span is cut and redacted: an exception's message may hold payload
values, and traces are kept and shown far from the job. Every message recorded (the status
description, the ``exception`` event's message and stack trace, a retry's reason) has the
password of any URL in it hidden (as settings are shown, :mod:`pipeline._redact`) and is cut at
``max_message_length`` characters (:data:`MESSAGE_MAX` by default); the stack trace keeps its
frames (files, functions, lines of code, no values) and at most :data:`STACKTRACE_MAX`
characters, the end.

OpenTelemetry is imported when a :class:`TracingInterceptor` is made, never by ``pipeline``
itself: an application without it pays nothing at enqueue.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._errors import ConfigurationError
from ._failures import cut_text
from ._interceptors import CallNext, JobCall
from ._redact import redact_url
from ._retry import Retry

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Span, TracerProvider

__all__ = ["TracingInterceptor"]

_INSTALL = "pip install 'kafka-pipeline[otel]'"

MESSAGE_MAX = 256
"""How many characters of an exception's message a span keeps by default (the rest is cut)."""
STACKTRACE_MAX = 8192
"""How many characters of an exception's stack trace a span keeps: the end, where the frame
that raised and the error are (as a dead letter keeps its traceback)."""
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


class TracingInterceptor:
    """A span per job attempt in the worker; the trace context in every job enqueued.

    ``tracer_provider``: where the spans go (default: the global one, set with
    ``opentelemetry.trace.set_tracer_provider``). ``propagator``: how the context is written
    to and read from the headers (default: the global one, W3C trace context and baggage).
    ``max_message_length``: how much of an exception's message a span keeps (see the module
    docstring).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
        *,
        max_message_length: int = MESSAGE_MAX,
    ) -> None:
        if max_message_length < 1:
            raise ConfigurationError(
                f"TracingInterceptor(max_message_length={max_message_length}): give at least 1"
            )
        try:
            from opentelemetry import propagate, trace
            from opentelemetry.context import Context
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
        self._empty = Context()
        """Where the job's context is read into: nothing of the worker's own context (its
        current span, its baggage) leaks into the job's."""
        self._message_max = max_message_length

    def enqueue_headers(self) -> Mapping[str, str]:
        """The current trace context as headers (none outside a span)."""
        carrier: dict[str, str] = {}
        self._inject(carrier)
        return carrier

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        """Run the attempt in a span: child of the context in the job's headers, else the root
        of a trace of its own."""
        job, ctx = call.job, call.ctx
        # A consumer without a propagated context starts a trace (OpenTelemetry's messaging
        # conventions): not a child of whatever span is current where the worker runs.
        parent = self._extract(job.headers, context=self._empty) if job.headers else self._empty
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
                reason = self._message(exc)
                span.add_event("retry requested", {"pipeline.retry.reason": reason})
                raise
            except BaseException as exc:  # CancelledError: the time limit or a shutdown
                self._failed(span, exc)
                raise
            span.set_attribute("pipeline.job.outcome", "succeeded")
            return result

    def _failed(self, span: Span, exc: BaseException) -> None:
        cancelled = not isinstance(exc, Exception)
        span.set_attribute("pipeline.job.outcome", "cancelled" if cancelled else "failed")
        message = self._message(exc)
        # The event record_exception() would add, with the message cut and redacted (it
        # records str(exc) and the traceback's messages whole).
        span.add_event(
            "exception",
            {
                "exception.type": _type_name(exc),
                "exception.message": message,
                "exception.stacktrace": self._stacktrace(exc),
                "exception.escaped": "True",  # it leaves the span: the chain re-raises it
            },
        )
        description = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, description))

    def _message(self, exc: BaseException) -> str:
        """``str(exc)``, URLs' passwords hidden, cut at ``max_message_length``."""
        try:
            text = str(exc)
        except Exception:  # the job's end must still be traced
            text = f"<{type(exc).__name__}: str() failed>"
        return cut_text(redact_url(text), self._message_max)  # redacted first: a cut URL hides

    def _stacktrace(self, exc: BaseException) -> str:
        """The traceback as Python prints it, chained errors included, with each message as
        :meth:`_message` records it; its last :data:`STACKTRACE_MAX` characters."""
        blocks: list[str] = []  # the outermost error first, each followed by the link to its own
        seen: set[int] = set()
        error = exc
        while True:
            seen.add(id(error))
            lines = []
            if error.__traceback__ is not None:
                lines.append("Traceback (most recent call last):\n")
                lines.extend(traceback.format_tb(error.__traceback__))
            message = self._message(error)
            lines.append(
                f"{_type_name(error)}: {message}\n" if message else f"{_type_name(error)}\n"
            )
            blocks.append("".join(lines))
            if error.__cause__ is not None:
                earlier, link = error.__cause__, _CAUSE
            elif error.__context__ is not None and not error.__suppress_context__:
                earlier, link = error.__context__, _CONTEXT
            else:
                break
            if id(earlier) in seen:
                break
            blocks.append(link)
            error = earlier
        text = "".join(reversed(blocks))
        return text if len(text) <= STACKTRACE_MAX else "...\n" + text[4 - STACKTRACE_MAX :]


def _type_name(error: BaseException) -> str:
    """``module.QualName`` of the error's class (only the name for a built-in), as
    OpenTelemetry's ``record_exception`` writes it."""
    cls = type(error)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
