"""The failure classification the worker and the test kit share (pipeline._failures)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from pipeline import (
    Backoff,
    DecodeError,
    Job,
    JobOptions,
    JobType,
    PayloadValidationError,
    PipelineError,
    Retry,
    TimeLimitError,
    UnknownJobTypeError,
)
from pipeline._failures import FailureVerdict, failed_job, judge_failure, traceback_text
from pipeline._records import DeadLetterReason

NOW = 1_800_000_000_000


class DeclinedError(Exception):
    pass


def handler() -> None: ...


TYPE = JobType(
    "pay",
    handler,
    JobOptions(backoff=Backoff(base_s=10, factor=2, jitter=0), fatal=(DeclinedError,)),
)


def job(attempt: int = 1, max_attempts: int = 3) -> Job:
    # A fixed created_at: two jobs made a millisecond apart would not compare equal.
    return Job(
        id="j", type="pay", payload=b"{}", attempt=attempt, max_attempts=max_attempts,
        created_at=NOW - 1000,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("error", "job_type", "reason"),
    [
        (DeclinedError("no"), TYPE, DeadLetterReason.FATAL_ERROR),
        (PayloadValidationError("pay", "bad"), TYPE, DeadLetterReason.VALIDATION_ERROR),
        (DecodeError("bad avro", b""), TYPE, DeadLetterReason.VALIDATION_ERROR),
        (UnknownJobTypeError("pay"), TYPE, DeadLetterReason.UNKNOWN_TYPE),
        (RuntimeError("x"), None, DeadLetterReason.UNKNOWN_TYPE),
    ],
)
def test_errors_that_are_never_retried_are_dead_at_the_first_attempt(
    error: BaseException, job_type: JobType | None, reason: DeadLetterReason
) -> None:
    verdict = judge_failure(job(), job_type, error, NOW)
    assert verdict == FailureVerdict(reason, False)
    assert verdict.dead


def test_a_transient_error_waits_the_backoff_then_the_last_attempt_is_dead() -> None:
    assert judge_failure(job(1), TYPE, RuntimeError(), NOW) == FailureVerdict(
        None, True, NOW + 10_000
    )
    assert judge_failure(job(2), TYPE, RuntimeError(), NOW).due_ms == NOW + 20_000
    last = judge_failure(job(3), TYPE, RuntimeError(), NOW)
    assert (last.reason, last.retryable) == (DeadLetterReason.MAX_ATTEMPTS, True)
    assert judge_failure(job(3), TYPE, TimeLimitError("pay", 1), NOW).reason == "timeout"


def test_retry_asks_its_own_time_and_never_one_before_now() -> None:
    assert judge_failure(job(), TYPE, Retry(after=5), NOW).due_ms == NOW + 5_000
    past = datetime.fromtimestamp((NOW - 60_000) / 1000, UTC)
    assert judge_failure(job(), TYPE, Retry(at=past), NOW).due_ms == NOW


def test_the_jitter_comes_from_the_given_random() -> None:
    jittery = JobType("j", handler, JobOptions(backoff=Backoff(base_s=10, jitter=0.5)))
    dues = {
        judge_failure(job(), jittery, RuntimeError(), NOW, random.Random(3)).due_ms for _ in "ab"
    }
    assert len(dues) == 1


def test_the_failed_job_carries_its_error_and_the_next_attempt_its_due_time() -> None:
    error = RuntimeError("boom")
    retry = judge_failure(job(), TYPE, error, NOW)
    again = failed_job(job(), retry, error, NOW, "w1")
    assert (again.attempt, again.not_before) == (2, NOW + 10_000)
    [entry] = again.errors
    assert (entry.attempt, entry.message, entry.retryable, entry.worker) == (1, "boom", True, "w1")
    dead = failed_job(job(3), judge_failure(job(3), TYPE, error, NOW), error, NOW, "w1")
    assert (dead.attempt, len(dead.errors)) == (3, 1)
    unknown = judge_failure(job(), None, None, NOW)
    assert failed_job(job(), unknown, None, NOW, "w1") == job()


def test_an_explicit_retry_is_never_fatal_even_when_fatal_names_its_base_class() -> None:
    strict = JobType("pay", handler, JobOptions(fatal=(Exception,)))
    verdict = judge_failure(job(), strict, Retry(after=5), NOW)
    assert verdict == FailureVerdict(None, True, NOW + 5_000)
    assert judge_failure(job(), strict, RuntimeError(), NOW).reason == "fatal_error"
    assert judge_failure(job(3), strict, Retry(), NOW).reason == "max_attempts"


@pytest.mark.parametrize("fatal", [Exception, TimeoutError, OSError, PipelineError, TimeLimitError])
def test_a_time_out_is_fatal_when_fatal_names_time_limit_error_or_a_base_of_it(
    fatal: type[Exception],
) -> None:
    # As docs/failures.md says: TimeLimitError is a TimeoutError (an OSError) and a PipelineError.
    strict = JobType("pay", handler, JobOptions(fatal=(fatal,)))
    verdict = judge_failure(job(), strict, TimeLimitError("pay", 1), NOW)
    assert verdict == FailureVerdict(DeadLetterReason.FATAL_ERROR, False)
    assert judge_failure(job(), TYPE, TimeLimitError("pay", 1), NOW).reason is None


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_an_error_that_cannot_be_printed_still_gets_a_history_entry() -> None:
    error = UnprintableError()
    again = failed_job(job(), judge_failure(job(), TYPE, error, NOW), error, NOW, "w1")
    [entry] = again.errors
    assert "UnprintableError" in entry.message


def test_an_error_message_that_is_not_utf8_safe_is_escaped() -> None:
    error = ValueError("file b'\udcff.txt' not found")  # os.fsdecode of a non-UTF-8 name
    again = failed_job(job(), judge_failure(job(), TYPE, error, NOW), error, NOW, "w1")
    [entry] = again.errors
    assert entry.message == "file b'\\udcff.txt' not found"
    entry.message.encode()


def test_a_traceback_that_is_not_utf8_safe_is_escaped() -> None:
    try:
        raise ValueError("bad \udcff")
    except ValueError as exc:
        text = traceback_text(exc)
    assert text is not None
    assert "bad \\udcff" in text
    text.encode()
