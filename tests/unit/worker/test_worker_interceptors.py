"""Interceptors (``Pipeline(middleware=[...])``) around handlers, through the worker's job path."""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

import pytest

from pipeline import (
    CallNext,
    ConfigurationError,
    Interceptor,
    Job,
    JobCall,
    JobCodec,
    PayloadValidationError,
    Pipeline,
    Retry,
    TimeLimitError,
)
from pipeline.testing import InMemoryTransport
from pipeline_worker import Outcome, OutcomeKind
from pipeline_worker.route.policy import Failure, FailurePolicy

from .support import Harness

NOW = 1_800_000_000_000


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def make_app(*middleware: Interceptor) -> Pipeline:
    return Pipeline(transport=InMemoryTransport(), middleware=middleware)


class Named:
    """Records entering and leaving, and on which thread the chain runs."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        self.log.append(f"{self.name}> {call.job.type} {threading.current_thread().name}")
        result = await next(call)
        self.log.append(f"<{self.name} {result!r}")
        return result


def test_interceptors_run_outermost_first_around_coroutines_and_plain_functions() -> None:
    log: list[str] = []

    async def main() -> None:
        app = make_app(Named("outer", log), Named("inner", log))

        @app.job("co")
        async def co(n: int) -> int:
            log.append(f"co {n}")
            return n + 1

        @app.job("plain")
        def plain(n: int) -> int:
            log.append(f"plain {n} {threading.current_thread().name.startswith('pipeline-pool')}")
            return n * 10

        h = Harness(app, concurrency=1)
        h.feed(h.message("co", {"n": 1}), h.message("plain", {"n": 2}))
        outcomes = await h.recorder.wait_for(2)
        assert [o.kind for o in outcomes] == [OutcomeKind.SUCCEEDED] * 2
        assert h.partition.commit_offset == 2

    run(main)
    loop_thread = threading.current_thread().name
    assert log == [
        f"outer> co {loop_thread}",
        f"inner> co {loop_thread}",
        "co 1",
        "<inner 2",
        "<outer 2",
        f"outer> plain {loop_thread}",  # a plain function's chain runs on the event loop
        f"inner> plain {loop_thread}",
        "plain 2 True",  # and its handler on the pool, returning its value to the chain
        "<inner 20",
        "<outer 20",
    ]


class Cached:
    """Short-circuits: a job whose payload is cached succeeds without running its handler."""

    def __init__(self) -> None:
        self.cache = {"hit": "from the cache"}

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        if call.kwargs.get("name") in self.cache:
            return self.cache[call.kwargs["name"]]
        return await next(replace(call, kwargs={**call.kwargs, "name": "changed"}))


def test_an_interceptor_can_answer_without_the_handler_or_change_its_arguments() -> None:
    ran: list[str] = []

    async def main() -> None:
        app = make_app(Cached())

        @app.job("look")
        def look(name: str) -> str:
            ran.append(name)
            return name

        h = Harness(app)
        h.feed(h.message("look", {"name": "hit"}), h.message("look", {"name": "miss"}))
        outcomes = await h.recorder.wait_for(2)
        assert [o.kind for o in outcomes] == [OutcomeKind.SUCCEEDED] * 2

    run(main)
    assert ran == ["changed"]


class DeclinedError(Exception):
    """Declared fatal for the job type below."""


class MapErrors:
    """Custom error mapping: an HTTP client's timeout becomes a retry in 1 s, or fatal."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        try:
            return await next(call)
        except TimeoutError as exc:
            if call.kwargs.get("give_up"):
                raise DeclinedError("the gateway timed out: not retried") from exc
            raise Retry(after=1) from exc


def decide(outcome: Outcome) -> tuple[bool, int | None, str]:
    """How the worker's failure policy classifies ``outcome``: dead?, retry time, reason."""
    policy = FailurePolicy(
        "t", [1.0, 30.0], codec=JobCodec(), worker="w", events=False, rand=random.Random(0)
    )
    failure = Failure(
        kind=outcome.kind,
        topic=outcome.topic,
        partition=outcome.partition,
        offset=outcome.offset,
        key=outcome.key,
        job=outcome.job,
        job_type=outcome.job_type,
        error=outcome.error,
    )
    move = policy.decide(failure, NOW)
    retried = None if move.dead else JobCodec().decode(move.records[0].value or b"")
    return move.dead, retried.not_before if retried is not None else None, move.reason


def test_an_error_an_interceptor_raises_is_classified_like_the_handlers_own() -> None:
    async def main() -> None:
        app = make_app(MapErrors())

        @app.job("charge", fatal=(DeclinedError,), max_attempts=5)
        async def charge(give_up: bool) -> None:
            raise TimeoutError("read timed out")

        @app.job("charge_sync", fatal=(DeclinedError,), max_attempts=5)
        def charge_sync(give_up: bool) -> None:
            raise TimeoutError("read timed out")

        h = Harness(app, concurrency=1)
        h.feed(
            *(
                h.message(t, {"give_up": g})
                for t in ("charge", "charge_sync")
                for g in (False, True)
            )
        )
        outcomes = await h.recorder.wait_for(4)
        assert [o.kind for o in outcomes] == [OutcomeKind.FAILED] * 4
        assert [type(o.error) for o in outcomes] == [Retry, DeclinedError] * 2
        for retried, fatal in (outcomes[0:2], outcomes[2:4]):
            assert decide(retried)[:2] == (False, NOW + 1000)  # Retry(after=1)
            assert decide(fatal)[0] is True  # declared fatal: dead-lettered at once
        assert h.partition.commit_offset == 4

    run(main)


class Tracing:
    """Records a span per job: type, id, attempt, outcome, start and end."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        span = {"type": call.job.type, "id": call.job.id, "attempt": call.job.attempt}
        span["start"] = loop_time()
        try:
            result = await next(call)
        except BaseException as exc:
            span["outcome"] = f"error {type(exc).__name__}"
            raise
        else:
            span["outcome"] = "ok"
            return result
        finally:
            span["end"] = loop_time()
            self.spans.append(span)


def loop_time() -> float:
    return asyncio.get_running_loop().time()


def test_a_tracing_interceptor_sees_every_outcome_including_the_time_limit() -> None:
    tracing = Tracing()

    async def main() -> None:
        app = make_app(tracing)

        @app.job("ok")
        async def ok() -> None:
            await asyncio.sleep(0)

        @app.job("boom")
        def boom() -> None:
            raise ValueError("bad")

        @app.job("stuck", time_limit=0.05)
        def stuck() -> None:
            release.wait(10)

        release = threading.Event()
        h = Harness(app)
        h.feed(h.message("ok"), h.message("boom"), h.message("stuck"))
        outcomes = await h.recorder.wait_for(3)
        release.set()
        by_offset = {o.offset: o for o in outcomes}
        assert by_offset[2].kind is OutcomeKind.TIMED_OUT
        assert isinstance(by_offset[2].error, TimeLimitError)
        assert by_offset[1].kind is OutcomeKind.FAILED

    run(main)
    spans = sorted(tracing.spans, key=lambda s: s["id"])
    assert [(s["type"], s["id"], s["attempt"], s["outcome"]) for s in spans] == [
        ("ok", "job-0", 1, "ok"),
        ("boom", "job-1", 1, "error ValueError"),
        ("stuck", "job-2", 1, "error CancelledError"),  # the time limit cancels the chain
    ]
    assert all(s["end"] >= s["start"] for s in spans)


class TenantMetrics:
    """Counts jobs and failures per tenant."""

    def __init__(self) -> None:
        self.jobs: Counter[str | None] = Counter()
        self.failed: Counter[str | None] = Counter()

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        self.jobs[call.job.tenant] += 1
        try:
            return await next(call)
        except Exception:
            self.failed[call.job.tenant] += 1
            raise


def test_a_metrics_interceptor_counts_jobs_per_tenant() -> None:
    metrics = TenantMetrics()

    async def main() -> None:
        app = make_app(metrics)

        @app.job("work")
        def work(fail: bool) -> None:
            if fail:
                raise RuntimeError("failed")

        h = Harness(app)
        codec = app.codec = JobCodec()  # the real envelope: it carries the tenant
        tenants = ["acme", "acme", "globex", None, "acme"]
        h.feed(
            *(
                h.message(
                    "work",
                    value=codec.encode(
                        Job(
                            id=f"j{i}",
                            type="work",
                            payload=b'{"fail": true}' if i == 4 else b'{"fail": false}',
                            tenant=t,
                        )
                    ),
                )
                for i, t in enumerate(tenants)
            )
        )
        await h.recorder.wait_for(5)

    run(main)
    assert metrics.jobs == Counter({"acme": 3, "globex": 1, None: 1})
    assert metrics.failed == Counter({"acme": 1})


class Broken:
    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        raise KeyError("the interceptor's own bug")


def test_an_interceptor_that_fails_before_next_fails_the_job_like_a_handler_error() -> None:
    ran: list[int] = []

    async def main() -> None:
        app = make_app(Broken())

        @app.job("never")
        def never() -> None:
            ran.append(1)

        h = Harness(app)
        h.feed(h.message("never"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.FAILED
        assert isinstance(outcome.error, KeyError)
        assert decide(outcome)[2] == "retry.0"  # transient, as a handler's KeyError would be
        assert h.partition.commit_offset == 1

    run(main)
    assert ran == []


def test_arguments_that_do_not_fit_still_fail_as_payload_errors_inside_a_chain() -> None:
    async def main() -> None:
        app = make_app(Named("outer", []))

        @app.job("loose")
        async def loose(a, /) -> None:  # type: ignore[no-untyped-def]
            return None

        @app.job("loose_sync")
        def loose_sync(a, /) -> None:  # type: ignore[no-untyped-def]
            return None

        @app.job("inside")
        def inside() -> None:
            raise TypeError("raised inside the handler")

        h = Harness(app, concurrency=1)
        h.feed(h.message("loose", {"a": 1}), h.message("loose_sync", {"a": 1}), h.message("inside"))
        outcomes = await h.recorder.wait_for(3)
        assert isinstance(outcomes[0].error, PayloadValidationError)
        assert isinstance(outcomes[1].error, PayloadValidationError)
        assert type(outcomes[2].error) is TypeError

    run(main)


def test_a_plain_function_raising_stop_iteration_inside_a_chain_fails_like_any_error() -> None:
    """A future cannot carry a StopIteration: the job hung (and the jobs that ended in the same
    batch with it were never resolved)."""

    async def main() -> None:
        app = make_app(Named("outer", []))

        @app.job("exhausted")
        def exhausted() -> None:
            next(iter([]))

        @app.job("fine")
        def fine() -> None:
            return None

        h = Harness(app, concurrency=4)
        h.feed(h.message("exhausted"), h.message("fine"), h.message("fine"))
        outcomes = await h.recorder.wait_for(3)
        failed = [o for o in outcomes if o.kind is OutcomeKind.FAILED]
        assert [o.job.type for o in failed if o.job is not None] == ["exhausted"]
        assert isinstance(failed[0].error, RuntimeError)
        assert isinstance(failed[0].error.__cause__, StopIteration)
        assert decide(failed[0])[2] == "retry.0"
        assert h.partition.commit_offset == 3

    run(main)


def test_a_context_handler_gets_the_same_context_as_the_chain() -> None:
    seen: list[bool] = []

    class Check:
        async def intercept(self, call: JobCall, next: CallNext) -> Any:
            assert "ctx" not in call.kwargs
            seen.append(call.ctx.job is call.job)
            return await next(call)

    async def main() -> None:
        app = make_app(Check())

        @app.job("with_ctx")
        async def with_ctx(ctx: Any, n: int) -> None:
            seen.append(ctx.offset == 0 and n == 3)

        h = Harness(app)
        h.feed(h.message("with_ctx", {"n": 3}))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.SUCCEEDED

    run(main)
    assert seen == [True, True]


def test_middleware_that_is_not_an_interceptor_is_a_configuration_error() -> None:
    class Sync:
        def intercept(self, call: JobCall, next: CallNext) -> Any:
            return next(call)

    for bad in (object(), Sync()):
        with pytest.raises(ConfigurationError, match="async def intercept"):
            make_app(bad)  # type: ignore[arg-type]
