"""Exception groups (``asyncio.TaskGroup``, ``except*``) in the failure classification: judged by
the exceptions they hold, as ``except*`` matches them (pipeline._failures)."""

from __future__ import annotations

import asyncio

import pytest

from pipeline import (
    Backoff,
    Job,
    JobOptions,
    JobType,
    PayloadValidationError,
    Pipeline,
    Retry,
    Settings,
)
from pipeline._failures import FailureVerdict, judge_failure
from pipeline._records import DeadLetterReason
from pipeline.testing import InMemoryTransport, JobStatus, run_job

NOW = 1_800_000_000_000
BACKOFF = Backoff(base_s=10, factor=2, jitter=0)


class DeclinedError(Exception):
    pass


def handler() -> None: ...


TYPE = JobType("pay", handler, JobOptions(backoff=BACKOFF, fatal=(DeclinedError,)))
STRICT = JobType("pay", handler, JobOptions(backoff=BACKOFF, fatal=(Exception,)))


def job(attempt: int = 1) -> Job:
    return Job(id="j", type="pay", payload=b"{}", attempt=attempt, max_attempts=3, created_at=NOW)


def group(*errors: Exception) -> ExceptionGroup[Exception]:
    return ExceptionGroup("unhandled errors in a TaskGroup", list(errors))


def task_group_error(*errors: Exception) -> BaseException:
    """What a handler's ``asyncio.TaskGroup`` raises when its tasks raise ``errors``."""

    async def fail(error: Exception) -> None:
        raise error

    async def handle() -> None:
        async with asyncio.TaskGroup() as tasks:
            for error in errors:
                tasks.create_task(fail(error))

    try:
        asyncio.run(handle())
    except BaseException as exc:
        return exc
    raise AssertionError("the task group did not fail")


def test_a_task_group_with_a_fatal_member_is_dead_at_once() -> None:
    # It was retried until max_attempts: only the group itself was matched against ``fatal``.
    error = task_group_error(RuntimeError("flaky"), DeclinedError("card declined"))
    assert isinstance(error, ExceptionGroup)
    assert judge_failure(job(), TYPE, error, NOW) == FailureVerdict(
        DeadLetterReason.FATAL_ERROR, False
    )


def test_a_fatal_member_is_found_at_any_depth_and_beside_a_retry() -> None:
    nested = group(RuntimeError("x"), group(Retry(after=5), group(DeclinedError("no"))))
    assert judge_failure(job(), TYPE, nested, NOW).reason == DeadLetterReason.FATAL_ERROR


def test_a_group_without_a_fatal_member_is_transient() -> None:
    error = task_group_error(RuntimeError("a"), ValueError("b"))
    assert judge_failure(job(), TYPE, error, NOW) == FailureVerdict(None, True, NOW + 10_000)
    last = judge_failure(job(3), TYPE, error, NOW)
    assert (last.reason, last.retryable) == (DeadLetterReason.MAX_ATTEMPTS, True)


def test_a_member_whose_payload_does_not_fit_makes_the_group_a_validation_error() -> None:
    error = group(RuntimeError("x"), PayloadValidationError("pay", "bad"))
    assert judge_failure(job(), TYPE, error, NOW) == FailureVerdict(
        DeadLetterReason.VALIDATION_ERROR, False
    )


def test_a_group_of_retries_is_never_fatal_even_under_fatal_exception() -> None:
    # It was dead-lettered as fatal_error: the group is an Exception.
    error = task_group_error(Retry(after=5), Retry(after=30))
    assert judge_failure(job(), STRICT, error, NOW) == FailureVerdict(None, True, NOW + 30_000)
    assert judge_failure(job(), STRICT, group(Retry(), RuntimeError()), NOW).dead
    assert judge_failure(job(3), STRICT, error, NOW).reason == DeadLetterReason.MAX_ATTEMPTS


def test_a_group_runs_again_when_the_latest_of_its_members_asks() -> None:
    # Retries of a group waited the backoff whatever their members asked for.
    later = group(Retry(after=5), group(Retry(after=30)))
    assert judge_failure(job(), TYPE, later, NOW).due_ms == NOW + 30_000
    # Another error, or a Retry without a time, adds the backoff's time (10 s here).
    assert judge_failure(job(), TYPE, group(Retry(after=5), KeyError()), NOW).due_ms == (
        NOW + 10_000
    )
    assert judge_failure(job(), TYPE, group(Retry(after=60), Retry()), NOW).due_ms == (NOW + 60_000)


def test_fatal_naming_a_group_class_still_matches_the_group_as_a_whole() -> None:
    groups = JobType("pay", handler, JobOptions(backoff=BACKOFF, fatal=(ExceptionGroup,)))
    error = group(RuntimeError("x"))
    assert judge_failure(job(), groups, error, NOW).reason == DeadLetterReason.FATAL_ERROR
    assert not judge_failure(job(), groups, RuntimeError("x"), NOW).dead


@pytest.mark.parametrize(
    ("errors", "status"),
    [((RuntimeError, DeclinedError), JobStatus.DEAD), ((RuntimeError, KeyError), JobStatus.RETRY)],
)
def test_run_job_classifies_a_task_group_as_the_worker_does(
    errors: tuple[type[Exception], ...], status: JobStatus
) -> None:
    app = Pipeline(Settings(namespace="acme"), transport=InMemoryTransport())

    @app.job("pay", fatal=(DeclinedError,), backoff=BACKOFF)
    async def pay() -> None:
        async def fail(error: Exception) -> None:
            raise error

        async with asyncio.TaskGroup() as tasks:
            for cls in errors:
                tasks.create_task(fail(cls("x")))

    result = run_job(app, "pay")
    assert isinstance(result.error, ExceptionGroup)
    assert result.status is status
    if status is JobStatus.DEAD:
        assert result.reason == DeadLetterReason.FATAL_ERROR
