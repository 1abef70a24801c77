"""Interceptors that misuse ``next`` (never await it, call it twice at once), in the worker."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Coroutine
from typing import Any

from pipeline import CallNext, Interceptor, JobCall, Pipeline
from pipeline.testing import InMemoryTransport
from pipeline_worker import OutcomeKind

from .support import Harness


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def make_app(*middleware: Interceptor) -> Pipeline:
    return Pipeline(transport=InMemoryTransport(), middleware=middleware)


class Unawaited:
    """Forgets the ``await``: returns ``next``'s coroutine instead of its result."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        return next(call)


class Twice:
    """Runs the rest of the chain twice at the same time."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        first, _ = await asyncio.gather(next(call), next(call))
        return first


def test_an_interceptor_returning_next_s_coroutine_fails_the_job_instead_of_losing_it() -> None:
    ran: list[str] = []

    async def main() -> None:
        app = make_app(Unawaited())

        @app.job("co")
        async def co() -> None:
            ran.append("co")

        @app.job("plain")
        def plain() -> None:
            ran.append("plain")

        h = Harness(app)
        h.feed(h.message("co"), h.message("plain"))
        outcomes = await h.recorder.wait_for(2)
        assert [o.kind for o in outcomes] == [OutcomeKind.FAILED] * 2
        assert all(isinstance(o.error, TypeError) for o in outcomes)
        assert all("await next(call)" in str(o.error) for o in outcomes)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the forgotten coroutine is closed, not left to warn
        run(main)
    assert ran == []


def test_next_called_twice_at_once_around_a_plain_function_ends_the_job() -> None:
    ran: list[int] = []

    async def main() -> None:
        app = make_app(Twice())

        @app.job("plain")
        def plain() -> None:
            ran.append(1)

        h = Harness(app)
        h.feed(h.message("plain"))
        [outcome] = await h.recorder.wait_for(1, timeout=5)
        assert outcome.kind is OutcomeKind.FAILED
        assert isinstance(outcome.error, RuntimeError)
        assert "at the same time" in str(outcome.error)
        assert h.partition.commit_offset == 1

    run(main)


class Forgiving:
    """Turns every failure, the time limit's cancellation included, into a result."""

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        try:
            return await next(call)
        except BaseException:
            return "forgiven"


def test_a_time_limit_swallowed_inside_the_chain_still_times_the_job_out() -> None:
    async def main() -> None:
        app = make_app(Forgiving())

        @app.job("stuck", time_limit=0.05)
        async def stuck() -> None:
            await asyncio.Event().wait()

        h = Harness(app)
        h.feed(h.message("stuck"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.TIMED_OUT  # run_job says the same

    run(main)
