"""run_job with interceptors that misuse the chain: it must judge them as the worker does."""

from __future__ import annotations

import asyncio
import warnings

from pipeline import Interceptor, Pipeline, Settings, TimeLimitError
from pipeline.testing import DeadLetterReason, InMemoryTransport, JobStatus, run_job

from ..worker.test_worker_interceptor_misuse import Forgiving, Twice, Unawaited


def make_app(*middleware: Interceptor) -> Pipeline:
    settings = Settings(namespace="acme")
    return Pipeline(settings, transport=InMemoryTransport(), middleware=middleware)


def test_an_interceptor_returning_next_s_coroutine_fails_the_job() -> None:
    app = make_app(Unawaited())
    ran: list[int] = []

    @app.job("co", max_attempts=1)
    async def co() -> None:
        ran.append(1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run_job(app, "co")
    assert result.status is JobStatus.DEAD
    assert isinstance(result.error, TypeError)
    assert "await next(call)" in str(result.error)
    assert ran == []


def test_a_time_limit_swallowed_inside_the_chain_still_times_the_job_out() -> None:
    app = make_app(Forgiving())

    @app.job("stuck", time_limit=0.05, max_attempts=1)
    async def stuck() -> None:
        await asyncio.Event().wait()

    result = run_job(app, "stuck")
    assert (result.status, result.reason) == (JobStatus.DEAD, DeadLetterReason.TIMEOUT)
    assert isinstance(result.error, TimeLimitError)


def test_next_called_twice_at_once_around_a_plain_function_fails_the_job() -> None:
    # The handler ran twice at once and the job succeeded, where the worker fails it.
    app = make_app(Twice())
    ran: list[int] = []

    @app.job("plain", max_attempts=1)
    def plain() -> None:
        ran.append(1)

    result = run_job(app, "plain")
    assert result.status is JobStatus.DEAD
    assert isinstance(result.error, RuntimeError)
    assert "at the same time" in str(result.error)
