"""pipeline.otel: the trace context travels in the job's headers; each attempt gets a span."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, SpanKind, StatusCode, Tracer

from pipeline import ConfigurationError, Job, JobContext, Pipeline, Retry
from pipeline._deadletters import replay_message
from pipeline._records import DeadLetter
from pipeline.otel import MESSAGE_MAX, STACKTRACE_MAX, TracingInterceptor
from pipeline.testing import FakeClock, InMemoryTransport, JobStatus, run_job, stub_worker


@dataclass
class Traced:
    app: Pipeline
    tracer: Tracer
    exporter: InMemorySpanExporter

    def sent(self) -> list[Job]:
        transport = self.app._transport
        assert isinstance(transport, InMemoryTransport)
        transport.flush(0)
        return [self.app.codec.decode(m.value) for m in transport.messages]

    def job_spans(self) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name.startswith("pipeline.job")]


@pytest.fixture
def traced_with() -> Iterator[Callable[..., Traced]]:
    """Makes a :class:`Traced` whose interceptor takes the options given."""
    providers: list[TracerProvider] = []

    def make(**options: Any) -> Traced:
        provider = TracerProvider()
        providers.append(provider)
        exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        app = Pipeline(
            transport=InMemoryTransport(),
            namespace="otel",
            middleware=[TracingInterceptor(tracer_provider=provider, **options)],
        )
        return Traced(app, provider.get_tracer("test"), exporter)

    yield make
    for provider in providers:
        provider.shutdown()


@pytest.fixture
def traced(traced_with: Callable[..., Traced]) -> Traced:
    return traced_with()


def _traceparent(context: SpanContext) -> str:
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def test_every_way_of_enqueueing_inside_a_span_writes_its_traceparent(traced: Traced) -> None:
    app = traced.app

    @app.job("greet")
    def greet(name: str) -> None: ...

    with traced.tracer.start_as_current_span("request") as span:
        app.enqueue("greet", {"name": "a"})
        greet.enqueue(name="b")
        greet.with_options(delay=30).enqueue(name="c")
        app.enqueue_many("greet", [{"name": "d"}, {"name": "e"}])
        app.submit("greet", {"name": "f"})
        app.enqueue("greet", {"name": "g"}, headers={"traceparent": "mine", "x": "1"})
    context = span.get_span_context()
    expected = _traceparent(context)
    jobs = traced.sent()
    assert [j.headers.get("traceparent") for j in jobs] == [expected] * 6 + ["mine"]
    assert jobs[-1].headers["x"] == "1", "the call's own headers are kept, and win"


def test_outside_a_span_or_without_the_interceptor_no_trace_header_is_written(
    traced: Traced,
) -> None:
    traced.app.enqueue("greet", {"name": "a"})
    plain = Pipeline(transport=InMemoryTransport(), namespace="otel")
    with traced.tracer.start_as_current_span("request"):
        plain.enqueue("greet", {"name": "b"})
        plain.enqueue_many("greet", [{"name": "c"}])
    assert traced.sent()[0].headers == {}
    assert isinstance(plain._transport, InMemoryTransport)
    plain.flush(0)
    assert [plain.codec.decode(m.value).headers for m in plain._transport.messages] == [{}, {}]


def test_the_job_span_is_a_child_of_the_enqueuing_span_with_its_attributes(
    traced: Traced,
) -> None:
    @traced.app.job("greet", max_attempts=3)
    def greet(name: str) -> str:
        return f"hi {name}"

    with traced.tracer.start_as_current_span("request") as request:
        result = run_job(traced.app, "greet", {"name": "a"}, tenant="acme")
    assert result.status is JobStatus.SUCCEEDED
    (span,) = traced.job_spans()
    parent = request.get_span_context()
    assert span.parent is not None
    assert (span.context.trace_id, span.parent.span_id) == (parent.trace_id, parent.span_id)
    assert span.name == "pipeline.job greet"
    assert span.kind is SpanKind.CONSUMER
    assert span.status.status_code is StatusCode.UNSET
    assert result.job is not None
    assert dict(span.attributes or {}) == {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": "otel.jobs.default",
        "messaging.destination.partition.id": "0",
        "messaging.kafka.message.offset": 0,
        "messaging.message.id": result.job.id,
        "pipeline.job.type": "greet",
        "pipeline.job.id": result.job.id,
        "pipeline.job.attempt": 1,
        "pipeline.job.max_attempts": 3,
        "pipeline.job.tenant": "acme",
        "pipeline.job.outcome": "succeeded",
    }


def test_a_failed_attempt_has_error_status_and_the_exception_recorded(traced: Traced) -> None:
    @traced.app.job("boom")
    def boom() -> None:
        raise ValueError("no luck")

    result = run_job(traced.app, "boom", {})
    assert result.status is JobStatus.RETRY
    (span,) = traced.job_spans()
    assert span.parent is None, "enqueued outside any span: the attempt starts a trace"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "ValueError: no luck"
    assert (span.attributes or {})["pipeline.job.outcome"] == "failed"
    (event,) = span.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "ValueError"


def test_a_requested_retry_is_an_outcome_not_an_error(traced: Traced) -> None:
    @traced.app.job("later")
    def later() -> None:
        raise Retry(after=5)

    assert run_job(traced.app, "later", {}).status is JobStatus.RETRY
    (span,) = traced.job_spans()
    assert span.status.status_code is StatusCode.UNSET
    assert (span.attributes or {})["pipeline.job.outcome"] == "retry"


def test_every_attempt_and_a_replay_of_the_dead_letter_stay_in_the_enqueuing_trace(
    traced: Traced,
) -> None:
    @traced.app.job("flaky", max_attempts=2)
    def flaky(ctx: JobContext) -> None:
        raise RuntimeError(f"attempt {ctx.attempt}")

    with stub_worker(traced.app, clock=FakeClock()) as worker:
        with traced.tracer.start_as_current_span("request") as request:
            flaky.enqueue()
        report = worker.drain()
        (dead,) = report.dead
        assert dead.job is not None
        letter = DeadLetter(
            reason="max_attempts",
            message="attempt 2",
            source_topic="otel.jobs.default",
            source_partition=0,
            source_offset=1,
            job=dead.job,
        )
        replayed = replay_message(letter, "otel", reset_attempts=True)
        worker.transport.produce(replayed.topic, replayed.value, replayed.key, lambda e, m: None)
        worker.drain()
    parent = request.get_span_context()
    spans = traced.job_spans()
    assert [(s.attributes or {})["pipeline.job.attempt"] for s in spans] == [1, 2, 1, 2]
    for span in spans:
        assert span.parent is not None
        assert (span.context.trace_id, span.parent.span_id) == (parent.trace_id, parent.span_id)
    assert dead.job.headers["traceparent"] == _traceparent(parent)


@pytest.mark.parametrize("coroutine", [False, True], ids=["function", "coroutine"])
def test_a_job_enqueued_by_a_handler_is_a_child_of_its_attempt(
    traced: Traced, coroutine: bool
) -> None:
    app = traced.app

    @app.job("child")
    def child() -> None: ...

    if coroutine:

        @app.job("parent")
        async def parent_async() -> None:
            child.enqueue()

    else:

        @app.job("parent")
        def parent_plain() -> None:
            child.enqueue()

    with stub_worker(app, clock=FakeClock()) as worker:
        app.enqueue("parent", {})
        report = worker.drain()
    assert [r.job_type for r in report.succeeded] == ["parent", "child"]
    first, second = traced.job_spans()
    assert second.parent is not None
    assert (second.context.trace_id, second.parent.span_id) == (
        first.context.trace_id,
        first.context.span_id,
    )


def test_without_the_extra_the_interceptor_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'kafka-pipeline\[otel\]'"):
        TracingInterceptor()


@pytest.mark.parametrize(
    ("propagator", "headers"),
    [
        (None, None),
        (None, {"x": "1"}),  # headers, but no trace context in them
        (W3CBaggagePropagator(), {"x": "1"}),  # it reads into the current context by default
    ],
    ids=["no headers", "other headers", "baggage propagator"],
)
def test_a_job_without_trace_context_starts_a_trace_not_a_child_of_the_workers_span(
    traced_with: Callable[..., Traced],
    propagator: TextMapPropagator | None,
    headers: dict[str, str] | None,
) -> None:
    """A consumer without a propagated context was parented to whatever span was current in
    the worker: unrelated jobs piled up under it, as one trace."""
    traced = traced_with(propagator=propagator)
    app = traced.app

    @app.job("greet")
    def greet() -> None: ...

    with stub_worker(app, clock=FakeClock()) as worker:
        app.enqueue("greet", {}, headers=headers)
        app.enqueue("greet", {}, headers=headers)
        with traced.tracer.start_as_current_span("the worker's own") as ambient:
            assert len(worker.drain().succeeded) == 2
    first, second = traced.job_spans()
    for span in (first, second):
        assert span.parent is None, "a root span: the start of the job's own trace"
        assert span.context.trace_id != ambient.get_span_context().trace_id
    assert first.context.trace_id != second.context.trace_id


SECRET = "hunter2"
URL = f"postgres://app:{SECRET}@db.internal/orders"


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


def _exception_event(span: ReadableSpan) -> dict[str, Any]:
    (event,) = [e for e in span.events if e.name == "exception"]
    return dict(event.attributes or {})


@pytest.mark.parametrize("limit", [None, 40])
def test_a_failures_messages_on_the_span_are_cut_and_hide_url_passwords(
    traced_with: Callable[..., Traced], limit: int | None
) -> None:
    """The whole message went on the span (status, event, stack trace): payload values with
    it, and a connection string's password."""
    options: dict[str, Any] = {} if limit is None else {"max_message_length": limit}
    traced = traced_with(**options)
    limit = limit or MESSAGE_MAX

    cards: dict[str, str] = {}

    @traced.app.job("charge")
    def charge(card: str) -> None:
        try:
            cards[card]
        except KeyError as exc:
            raise ConnectionError(f"cannot reach {URL} for card {card}") from exc

    card = "4111" * 500
    assert run_job(traced.app, "charge", {"card": card}).status is JobStatus.RETRY
    (span,) = traced.job_spans()
    event = _exception_event(span)
    message = event["exception.message"]
    assert message.startswith("cannot reach postgres://app:**********")
    assert len(message) == limit
    assert message.endswith("…")
    assert span.status.description == f"ConnectionError: {message}"
    assert event["exception.type"] == "ConnectionError"
    stacktrace = event["exception.stacktrace"]
    assert "in charge" in stacktrace, "the frames are kept"
    assert "The above exception was the direct cause of the following exception" in stacktrace
    assert stacktrace.rstrip().endswith(f"ConnectionError: {message}")
    everything = [str(value) for value in (*event.values(), span.status.description)]
    for text in everything:
        assert SECRET not in text
        assert "4111" * 65 not in text, "every message is cut, the cause's (the card) too"


def test_a_long_stack_trace_keeps_its_end(traced_with: Callable[..., Traced]) -> None:
    traced = traced_with()

    @traced.app.job("chained")
    def chained(n: int) -> None:
        error: Exception | None = None
        for level in range(n):
            try:
                raise ValueError(f"level {level}") from error
            except ValueError as exc:
                error = exc
        assert error is not None
        raise error

    assert run_job(traced.app, "chained", {"n": 200}).status is JobStatus.RETRY
    (span,) = traced.job_spans()
    stacktrace = _exception_event(span)["exception.stacktrace"]
    assert len(stacktrace) == STACKTRACE_MAX
    assert stacktrace.startswith("...\n")
    assert stacktrace.endswith("ValueError: level 199\n")


def test_an_error_whose_message_cannot_be_read_is_still_traced_and_retried(
    traced_with: Callable[..., Traced],
) -> None:
    traced = traced_with()

    @traced.app.job("odd")
    def odd() -> None:
        raise UnprintableError()

    assert run_job(traced.app, "odd", {}).status is JobStatus.RETRY
    (span,) = traced.job_spans()
    assert _exception_event(span)["exception.message"] == "<UnprintableError: str() failed>"
    assert span.status.description == "UnprintableError: <UnprintableError: str() failed>"


def test_a_retry_reason_is_cut_and_hides_url_passwords_too(
    traced_with: Callable[..., Traced],
) -> None:
    traced = traced_with(max_message_length=50)

    @traced.app.job("later")
    def later() -> None:
        raise Retry(f"{URL} is busy " + "x" * 500, after=5)

    assert run_job(traced.app, "later", {}).status is JobStatus.RETRY
    (span,) = traced.job_spans()
    (event,) = span.events
    reason = (event.attributes or {})["pipeline.retry.reason"]
    assert isinstance(reason, str)
    assert SECRET not in reason
    assert len(reason) == 50


def test_a_message_length_below_one_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="max_message_length=0"):
        TracingInterceptor(max_message_length=0)
