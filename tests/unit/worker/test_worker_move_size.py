"""A failed job whose move would not fit in one Kafka message still moves (route/fit.py):
retried with a shorter history, dead-lettered, or dead-lettered without the job, never a record
the producer refuses (which aborted every transaction and stopped the worker at each attempt)."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pipeline import Job
from pipeline._codec import DeadLetterCodec
from pipeline._failures import with_attempt_error
from pipeline._producer import fits_in_message
from pipeline._records import DeadLetterReason
from pipeline_worker.route.policy import FailurePolicy, Move

from .test_worker_failures import CODEC, NOW, TIERS, DeclinedError, failure, job, raised, value

LIMIT = 8_000


def sized(payload_bytes: int, attempt: int = 1, history: int = 0) -> Job:
    """A job of about ``payload_bytes`` of payload with ``history`` earlier errors of 1,500
    characters each."""
    the_job = dataclasses.replace(job(attempt, max_attempts=9), payload=b"x" * payload_bytes)
    for n in range(history):
        error = raised(ValueError(f"{n} " + "e" * 1500))
        the_job = with_attempt_error(the_job, error, True, NOW, "host:0")
    return the_job


def decide(the_job: Job, error: BaseException) -> Move:
    policy = FailurePolicy(
        "acme", TIERS, codec=CODEC, worker="host:1", events=True, rand=random.Random(0),
        max_bytes=LIMIT,
    )  # fmt: skip
    return policy.decide(failure(error, the_job), NOW)


def fits(move: Move) -> bool:
    return all(fits_in_message(LIMIT, value(r), r.key) for r in move.records)


def test_a_retry_that_fits_keeps_its_whole_history() -> None:
    move = decide(sized(1000, attempt=3, history=2), raised(ValueError("again")))
    assert not move.dead
    retried = CODEC.decode(value(move.records[0]))
    assert [len(e.message) for e in retried.errors] == [1502, 1502, 5]


def test_a_retry_too_large_keeps_its_last_error_cut_short() -> None:
    move = decide(sized(5000, attempt=3, history=2), raised(ValueError("again " + "z" * 3000)))
    assert not move.dead
    assert fits(move)
    retried = CODEC.decode(value(move.records[0]))
    assert retried.attempt == 4
    [last] = retried.errors
    assert last.message.startswith("again zz")
    assert len(last.message) == 200


def test_a_job_too_large_to_retry_at_all_is_dead_lettered_as_too_large() -> None:
    move = decide(sized(LIMIT - 500), raised(ValueError("boom")))
    assert move.dead
    assert move.reason == DeadLetterReason.TOO_LARGE
    assert fits(move)


@pytest.mark.parametrize(
    ("payload", "with_job"), [(5000, True), (LIMIT - 600, False)], ids=["lean", "without the job"]
)
def test_a_dead_letter_too_large_is_made_to_fit(payload: int, with_job: bool) -> None:
    fatal = raised(DeclinedError("declined " + "d" * 3000))
    move = decide(sized(payload, history=2), fatal)
    assert move.dead
    assert move.reason == DeadLetterReason.FATAL_ERROR
    assert fits(move)
    letter = DeadLetterCodec().decode(value(move.records[0]))
    assert letter.traceback is None
    if with_job:
        assert letter.job is not None
        assert len(letter.job.errors) == 1
    else:
        assert letter.job is None
        assert letter.raw_value is None
        assert "too large for a dead letter under message.max.bytes 8000" in letter.message
        assert "acme.jobs.high[2]@41" in letter.message


def test_a_dead_letter_keyed_by_a_key_over_half_the_limit_fits() -> None:
    """The letter went keyed by the job's key and held a copy of it: with a key of 4,500 bytes
    under a limit of 8,000 even the letter without the job was refused, every time. A key over
    half the limit now goes in the letter once, as the copy a replay sends the job with."""
    big_key = b"k" * 4_500
    policy = FailurePolicy(
        "acme", TIERS, codec=CODEC, worker="host:1", events=False, max_bytes=LIMIT
    )
    fatal = raised(DeclinedError("declined"))
    move = policy.decide(failure(fatal, sized(2_000), key=big_key), NOW)
    assert move.dead
    assert fits(move)
    [letter] = [r for r in move.records if r.topic == "acme.dlq"]
    assert letter.key is None
    assert DeadLetterCodec().decode(value(letter)).raw_key == big_key
