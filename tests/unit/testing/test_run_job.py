"""run_job: one job through the real codec, context, interceptors, validation, time limit and
the worker's failure classification."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pipeline import (
    Backoff,
    CallNext,
    ConfigurationError,
    DecodeError,
    Interceptor,
    JobCall,
    JobContext,
    JsonPayload,
    PayloadValidationError,
    Pipeline,
    Priority,
    Retry,
    Settings,
    TimeLimitError,
    UnknownJobTypeError,
)
from pipeline.testing import (
    DeadLetterReason,
    FakeClock,
    InMemoryTransport,
    JobStatus,
    run_job,
    stub_worker,
)


class DeclinedError(Exception):
    pass


def make_app(*middleware: Interceptor) -> Pipeline:
    settings = Settings(namespace="acme")
    return Pipeline(settings, transport=InMemoryTransport(), middleware=middleware)


NO_JITTER = Backoff(base_s=10, factor=2, jitter=0)


def test_a_sync_handler_succeeds_with_its_value_and_the_decoded_job() -> None:
    app = make_app()

    @app.job("add")
    def add(a: int, b: int) -> int:
        return a + b

    result = run_job(app, "add", {"a": 2, "b": 3})
    assert result.status is JobStatus.SUCCEEDED
    assert (result.value, result.error, result.attempt) == (5, None, 1)
    assert result.job is not None
    assert (result.job.type, result.job.attempt, result.job.max_attempts) == ("add", 1, 5)
    assert (result.retry_at_ms, result.retry_in_s, result.reason) == (None, None, None)


def test_an_async_handler_gets_its_context_and_the_payload_as_the_worker_decodes_it() -> None:
    app = make_app()
    seen: list[tuple[datetime, JobContext]] = []

    @app.job("remind", priority="high")
    async def remind(ctx: JobContext, when: datetime) -> str:
        seen.append((when, ctx))
        return ctx.id

    result = run_job(
        app, "remind", {"when": "2026-03-01T12:00:00Z"}, key="user-7", headers={"trace": "t1"},
        tenant="acme-eu", attempt=2,
    )  # fmt: skip
    assert result.status is JobStatus.SUCCEEDED
    [(when, ctx)] = seen
    assert when == datetime(2026, 3, 1, 12, tzinfo=UTC)  # the JSON string validated to a datetime
    assert result.job is not None
    assert result.value == result.job.id == ctx.id
    assert (ctx.attempt, ctx.tenant, ctx.key, dict(ctx.headers)) == (
        2,
        "acme-eu",
        b"user-7",
        {"trace": "t1"},
    )
    assert (ctx.topic, ctx.priority) == ("acme.jobs.high", "high")


def test_retry_asks_for_its_time_on_the_given_clock() -> None:
    app = make_app()
    clock = FakeClock()

    @app.job("poll")
    def poll() -> None:
        raise Retry(after=30)

    result = run_job(app, "poll", clock=clock)
    assert result.status is JobStatus.RETRY
    assert isinstance(result.error, Retry)
    assert result.retry_at_ms == clock.now_ms() + 30_000
    assert result.retry_in_s == 30.0


def test_a_retry_at_a_wall_clock_time_is_as_far_ahead_on_the_given_clock() -> None:
    app = make_app()
    clock = FakeClock()

    @app.job("poll_at")
    def poll_at() -> None:
        raise Retry(at=datetime.now(UTC) + timedelta(minutes=5))

    result = run_job(app, "poll_at", clock=clock)
    assert result.retry_in_s is not None
    assert 300 <= result.retry_in_s < 301
    assert result.retry_at_ms == clock.now_ms() + round(result.retry_in_s * 1000)


def test_a_transient_error_is_retried_after_the_type_s_backoff_until_max_attempts() -> None:
    app = make_app()
    clock = FakeClock()

    @app.job("flaky", max_attempts=3, backoff=NO_JITTER)
    def flaky() -> None:
        raise RuntimeError("boom")

    first = run_job(app, "flaky", clock=clock)
    second = run_job(app, "flaky", attempt=2, clock=clock)
    last = run_job(app, "flaky", attempt=3, clock=clock)
    assert [first.status, second.status, last.status] == [JobStatus.RETRY] * 2 + [JobStatus.DEAD]
    assert [first.retry_in_s, second.retry_in_s] == [10.0, 20.0]
    assert last.reason == DeadLetterReason.MAX_ATTEMPTS
    assert f"{last.reason}" == "max_attempts"  # the string on the dead letter
    assert isinstance(last.error, RuntimeError)


def test_the_jitter_is_drawn_from_the_given_random() -> None:
    app = make_app()

    @app.job("jittery", backoff=Backoff(base_s=10, jitter=0.5))
    def jittery() -> None:
        raise RuntimeError("boom")

    clock = FakeClock()
    waits = {run_job(app, "jittery", clock=clock, rand=random.Random(7)).retry_in_s for _ in "ab"}
    assert len(waits) == 1
    [wait] = waits
    assert wait is not None
    assert 5.0 <= wait <= 15.0


def test_a_fatal_error_is_dead_at_once() -> None:
    app = make_app()

    @app.job("charge", fatal=(DeclinedError,))
    async def charge() -> None:
        raise DeclinedError("card declined")

    result = run_job(app, "charge")
    assert (result.status, result.reason, result.attempt) == (JobStatus.DEAD, "fatal_error", 1)
    assert isinstance(result.error, DeclinedError)


@pytest.mark.parametrize("annotated", [True, False])
def test_a_payload_that_does_not_fit_the_handler_is_a_validation_error(annotated: bool) -> None:
    app = make_app()
    if annotated:

        @app.job("send")
        def send(to: str) -> None: ...
    else:

        @app.job("send")
        def send_any(to):  # type: ignore[no-untyped-def]
            return None

    result = run_job(app, "send", {"to": 1} if annotated else {"too": "a"})
    assert (result.status, result.reason) == (JobStatus.DEAD, DeadLetterReason.VALIDATION_ERROR)
    assert isinstance(result.error, PayloadValidationError)


def test_an_unknown_type_is_dead_without_running() -> None:
    result = run_job(make_app(), "nobody.handles.this")
    assert (result.status, result.reason) == (JobStatus.DEAD, "unknown_type")
    assert isinstance(result.error, UnknownJobTypeError)


def test_an_async_handler_past_its_time_limit_times_out() -> None:
    app = make_app()

    @app.job("stuck", time_limit=0.05, max_attempts=2)
    async def stuck() -> None:
        await asyncio.Event().wait()

    first = run_job(app, "stuck")
    last = run_job(app, "stuck", attempt=2)
    assert first.status is JobStatus.RETRY
    assert isinstance(first.error, TimeLimitError)
    assert (last.status, last.reason) == (JobStatus.DEAD, DeadLetterReason.TIMEOUT)


def test_a_sync_handler_past_its_time_limit_times_out_and_its_thread_is_left() -> None:
    app = make_app()
    release = threading.Event()

    @app.job("blocking", time_limit=0.05, max_attempts=1)
    def blocking() -> None:
        release.wait(10)

    try:
        result = run_job(app, "blocking")
    finally:
        release.set()
    assert (result.status, result.reason) == (JobStatus.DEAD, DeadLetterReason.TIMEOUT)


def _returned(run: Any) -> Any:
    """What ``run()`` returned, run on a thread of its own; fails the test if it had not
    returned after 30 s (waiting for what its time limit left behind)."""
    returned: list[Any] = []
    thread = threading.Thread(target=lambda: returned.append(run()), daemon=True)
    thread.start()
    thread.join(30)
    assert returned, "the run waited for what its time limit left behind"
    return returned[0]


def test_a_handler_that_ignores_its_cancellation_times_out_all_the_same() -> None:
    # run_job, and the stub's drain, waited for it for good: the test hung.
    app = make_app()
    cancelled = threading.Event()

    @app.job("stubborn", time_limit=0.05, max_attempts=1)
    async def stubborn() -> None:
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()

    result = _returned(lambda: run_job(app, "stubborn"))
    assert (result.status, result.reason) == (JobStatus.DEAD, DeadLetterReason.TIMEOUT)
    assert cancelled.is_set(), "it was cancelled at its deadline"

    def drained() -> Any:
        with stub_worker(app, clock=FakeClock()) as worker:
            app.enqueue("stubborn", {})
            return worker.drain()

    report = _returned(drained)
    assert [(r.status, r.reason) for r in report.results] == [
        (JobStatus.DEAD, DeadLetterReason.TIMEOUT)
    ]


def test_a_coroutine_awaiting_a_thread_that_has_not_returned_times_out_without_it() -> None:
    # Closing run_job's loop waited for the default executor's threads, with no bound.
    app = make_app()
    release = threading.Event()

    @app.job("waits", time_limit=0.05, max_attempts=1)
    async def waits() -> None:
        await asyncio.to_thread(release.wait, 60)

    try:
        result = _returned(lambda: run_job(app, "waits"))
    finally:
        release.set()
    assert (result.status, result.reason) == (JobStatus.DEAD, DeadLetterReason.TIMEOUT)


def test_a_handler_s_own_timeout_error_is_not_the_time_limit() -> None:
    app = make_app()

    @app.job("http", time_limit=30, max_attempts=1)
    async def http() -> None:
        raise TimeoutError("read timed out")

    result = run_job(app, "http")
    assert (result.status, result.reason) == (JobStatus.DEAD, DeadLetterReason.MAX_ATTEMPTS)
    assert type(result.error) is TimeoutError


class Recorder:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        self.log.append(f"{self.name}>{call.job.type}")
        result = await next(call)
        self.log.append(f"<{self.name}")
        return result


class Doubler:
    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        return await next(dataclasses.replace(call, kwargs={"n": call.kwargs["n"] * 2}))


class MapErrors:
    """An HTTP client's timeout becomes a retry in 1 s."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        try:
            return await next(call)
        except TimeoutError as exc:
            raise Retry(after=1) from exc


@pytest.mark.parametrize("is_async", [True, False])
def test_the_app_s_interceptors_run_around_the_handler_outermost_first(is_async: bool) -> None:
    log: list[str] = []
    app = make_app(Recorder("a", log), Recorder("b", log), Doubler())
    if is_async:

        @app.job("echo")
        async def echo(n: int) -> int:
            return n
    else:

        @app.job("echo")
        def echo_sync(n: int) -> int:
            return n

    result = run_job(app, "echo", {"n": 2})
    assert (result.status, result.value) == (JobStatus.SUCCEEDED, 4)
    assert log == ["a>echo", "b>echo", "<b", "<a"]


def test_what_an_interceptor_raises_is_classified_like_the_handler_s_error() -> None:
    app = make_app(MapErrors())
    clock = FakeClock()

    @app.job("gateway", max_attempts=5)
    def gateway() -> None:
        raise TimeoutError("read timed out")

    result = run_job(app, "gateway", clock=clock)
    assert (result.status, result.retry_in_s) == (JobStatus.RETRY, 1.0)


def test_a_handler_call_that_does_not_fit_under_interceptors_is_a_validation_error() -> None:
    seen: list[BaseException] = []

    class Watch:
        async def intercept(self, call: JobCall, next: CallNext) -> Any:
            try:
                return await next(call)
            except BaseException as exc:
                seen.append(exc)
                raise

    app = make_app(Watch())

    @app.job("strict")
    def strict(a):  # type: ignore[no-untyped-def]
        return a

    result = run_job(app, "strict", {"b": 1})
    assert result.reason == DeadLetterReason.VALIDATION_ERROR
    assert [type(e) for e in seen] == [PayloadValidationError], "interceptors see the mapped error"


def test_run_job_works_inside_a_running_event_loop() -> None:
    app = make_app()

    @app.job("inc")
    async def inc(n: int) -> int:
        return n + 1

    async def main() -> int:
        return run_job(app, "inc", {"n": 1}).value  # type: ignore[no-any-return]

    assert asyncio.run(main()) == 2


def test_run_job_takes_no_delay() -> None:
    with pytest.raises(ConfigurationError, match="stub worker"):
        run_job(make_app(), "t", delay=5)
    with pytest.raises(ConfigurationError, match="at least 1"):
        run_job(make_app(), "t", attempt=0)


@pytest.mark.parametrize(
    ("arguments", "error", "names"),
    [
        ({"attempt": "2"}, ConfigurationError, "attempt=...) must be an int, got '2'"),
        ({"attempt": True}, ConfigurationError, "attempt=...) must be an int, got True"),
        ({"clock": 5.0}, ConfigurationError, "clock=...) must be a pipeline.testing.FakeClock"),
        ({"rand": 7}, ConfigurationError, "rand=...) must be a random.Random, got 7"),
        ({"priorty": "high"}, TypeError, "unexpected keyword argument 'priorty'"),
    ],
)
def test_a_mistyped_argument_is_named(
    arguments: dict[str, object], error: type[Exception], names: str
) -> None:
    with pytest.raises(error) as raised:
        run_job(make_app(), "t", **arguments)  # type: ignore[arg-type]
    assert names in str(raised.value)


def test_max_attempts_of_the_enqueue_and_of_the_type_both_hold() -> None:
    app = make_app()

    @app.job("few", max_attempts=2)
    def few() -> None:
        raise RuntimeError("no")

    assert run_job(app, "few", attempt=2).reason == DeadLetterReason.MAX_ATTEMPTS
    assert run_job(app, "few", attempt=1, max_attempts=1).reason == DeadLetterReason.MAX_ATTEMPTS


def test_a_plain_function_raising_stop_iteration_is_retried_not_hung() -> None:
    """A future cannot carry a StopIteration: the run waited for it for good."""
    app = make_app()

    @app.job("exhausted")
    def exhausted() -> None:
        next(iter([]))

    async def main() -> Any:
        return await asyncio.wait_for(asyncio.to_thread(run_job, app, "exhausted"), 10)

    result = asyncio.run(main())
    assert result.status is JobStatus.RETRY
    assert isinstance(result.error, RuntimeError)
    assert isinstance(result.error.__cause__, StopIteration)


def test_a_handler_raising_system_exit_fails_its_job_as_in_the_worker() -> None:
    app = make_app()

    @app.job("quits")
    def quits() -> None:
        raise SystemExit(3)

    @app.job("aquits")
    async def aquits() -> None:
        raise SystemExit(4)

    for name in ("quits", "aquits"):
        result = run_job(app, name)
        assert result.status is JobStatus.RETRY
        assert isinstance(result.error, SystemExit)


def test_a_payload_codec_failing_with_its_own_error_dead_letters_the_job() -> None:
    app = make_app()

    class Buggy(JsonPayload):
        def decode(self, job_type: str, data: bytes) -> dict[str, Any]:
            raise KeyError("missing")

    @app.job("buggy", payload=Buggy())
    def buggy(n) -> None:  # type: ignore[no-untyped-def]  # unannotated: the codec decodes
        return None

    result = run_job(app, "buggy", {"n": 1})
    assert result.status is JobStatus.DEAD
    assert isinstance(result.error, DecodeError)
    assert "KeyError" in str(result.error)


def test_jobs_a_handler_enqueues_stay_in_the_test_and_are_listed() -> None:
    """Never to the application's own transport (Kafka here: nothing listens on port 9)."""
    app = Pipeline(Settings(namespace="acme", bootstrap_servers="127.0.0.1:9"))
    own = app._transport

    @app.job("child")
    def child(n: int) -> None:
        return None

    @app.job("parent")
    def parent(n: int) -> None:
        app.enqueue("child", {"n": n + 1}, priority="high")

    try:
        result = run_job(app, "parent", {"n": 1})
        assert result.status is JobStatus.SUCCEEDED
        assert [(j.type, j.payload, j.priority) for j in result.enqueued] == [
            ("child", b'{"n":2}', Priority.HIGH)
        ]
        assert app._transport is own
        app.flush(0)  # raises if a job of the run waited for Kafka
    finally:
        app.close()


def test_fail_fast_names_only_the_last_job_on_an_exception_raised_again() -> None:
    app = make_app()
    shared = ValueError("always the same object")

    @app.job("same")
    def same() -> None:
        raise shared

    with stub_worker(app, fail_fast=True) as worker:
        for _ in range(3):
            app.enqueue("same", {})
            with pytest.raises(ValueError, match="always the same object"):
                worker.drain()
    assert len(shared.__notes__) == 1


@pytest.mark.parametrize("partitions", [3, 12])
def test_the_context_names_the_partition_the_app_s_topics_give_the_key(partitions: int) -> None:
    """run_job routed on a topic of 6 partitions, whatever the application's count."""
    from pipeline.testing._partitioner import partition_for

    app = Pipeline(
        Settings(namespace="acme", topics={"partitions": partitions}),
        transport=InMemoryTransport(),
    )
    seen: list[int] = []

    @app.job("keyed")
    def keyed(ctx: JobContext) -> None:
        seen.append(ctx.partition)

    run_job(app, "keyed", {}, key="order-17")
    assert seen == [partition_for(b"order-17", partitions)]
