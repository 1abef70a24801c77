"""FailurePolicy: how a failed message is classified and what records its move writes."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import random
from datetime import UTC, datetime

import pytest

from pipeline import (
    Backoff,
    DecodeError,
    Job,
    JobCodec,
    JobOptions,
    JobType,
    PayloadValidationError,
    Priority,
    Retry,
    TimeLimitError,
)
from pipeline._codec import DeadLetterCodec, EventCodec
from pipeline._failures import traceback_digest, traceback_text
from pipeline._records import DeadLetterReason, EventKind
from pipeline_worker.route.outcome import OutcomeKind
from pipeline_worker.route.policy import (
    DEFERRED,
    Failure,
    FailurePolicy,
    Record,
)

NOW = 1_800_000_000_000
CODEC = JobCodec()
TIERS = [5.0, 30.0, 300.0]


class DeclinedError(Exception):
    pass


def handler(n: int) -> None: ...


JOB_TYPE = JobType(
    "pay",
    handler,
    JobOptions(backoff=Backoff(base_s=10, factor=2, jitter=0), fatal=(DeclinedError,)),
)


def policy(*, events: bool = True) -> FailurePolicy:
    return FailurePolicy(
        "acme", TIERS, codec=CODEC, worker="host:1", events=events, rand=random.Random(0)
    )


def job(attempt: int = 1, max_attempts: int = 3) -> Job:
    return Job(
        id="j1",
        type="pay",
        payload=b'{"n": 1}',
        priority=Priority.HIGH,
        attempt=attempt,
        max_attempts=max_attempts,
        created_at=NOW - 5000,
    )


def failure(error: BaseException | None, the_job: Job | None = None, **kw: object) -> Failure:
    fields: dict[str, object] = {
        "kind": OutcomeKind.FAILED,
        "topic": "acme.jobs.high",
        "partition": 2,
        "offset": 41,
        "key": b"k",
        "job": the_job if the_job is not None else job(),
        "job_type": JOB_TYPE,
        "error": error,
    }
    fields.update(kw)
    return Failure(**fields)  # type: ignore[arg-type]


def value(record: Record) -> bytes:
    """A move's record always has a value (tombstones are for idempotency keys only)."""
    assert record.value is not None
    return record.value


def raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as exc:
        return exc


@pytest.mark.parametrize(
    ("delay_ms", "tier"),
    [(0, 0), (4_999, 0), (5_000, 0), (29_999, 0), (30_000, 1), (299_000, 1), (300_000, 2),
     (600_000, 2), (600_001, DEFERRED)],
)  # fmt: skip
def test_a_delay_goes_to_the_largest_tier_not_above_it(delay_ms: int, tier: int) -> None:
    assert policy().tier_for(delay_ms) == tier


def test_a_job_of_a_type_nobody_handles_is_counted_under_no_type_of_its_own() -> None:
    """Its type is whatever the message says: as a metric label it would grow for ever."""
    stranger = dataclasses.replace(job(), type="anything-at-all-7f3a")
    move = policy().decide(
        failure(None, stranger, kind=OutcomeKind.UNKNOWN_TYPE, job_type=None), NOW
    )
    assert (move.dead, move.reason, move.job_type) == (True, "unknown_type", "?")
    assert policy().decide(failure(raised(DeclinedError())), NOW).job_type == "pay"


def test_a_transient_error_is_retried_after_the_backoff_with_its_error_in_the_history() -> None:
    move = policy().decide(failure(raised(RuntimeError("boom"))), NOW)
    assert not move.dead
    assert move.reason == "retry.0"
    retry_record, event_record = move.records
    assert retry_record.topic == "acme.retry.0"
    assert retry_record.key == b"k"
    retried = CODEC.decode(value(retry_record))
    assert (retried.id, retried.attempt, retried.priority) == ("j1", 2, Priority.HIGH)
    assert retried.not_before == NOW + 10_000
    [error] = retried.errors
    assert (error.attempt, error.at, error.error_class) == (1, NOW, "builtins.RuntimeError")
    assert (error.message, error.retryable, error.worker) == ("boom", True, "host:1")
    assert error.traceback_digest is not None
    assert len(error.traceback_digest) == 12
    event = EventCodec(CODEC.store).decode(value(event_record))
    assert (event.kind, event.job_id, event.attempt) == (EventKind.RETRIED, "j1", 1)
    assert event_record.topic == "acme.events"


def test_the_backoff_grows_with_the_attempt_and_picks_the_tier() -> None:
    move = policy().decide(failure(raised(RuntimeError()), job(attempt=2, max_attempts=5)), NOW)
    assert CODEC.decode(value(move.records[0])).not_before == NOW + 20_000
    assert move.records[0].topic == "acme.retry.0"
    move = policy().decide(failure(raised(RuntimeError()), job(attempt=3, max_attempts=5)), NOW)
    assert CODEC.decode(value(move.records[0])).not_before == NOW + 40_000
    assert move.records[0].topic == "acme.retry.1"


def test_retry_asks_for_its_own_time_and_a_far_one_goes_through_deferred() -> None:
    move = policy().decide(failure(Retry(after=60)), NOW)
    assert move.records[0].topic == "acme.retry.1"
    assert CODEC.decode(value(move.records[0])).not_before == NOW + 60_000
    at = datetime.fromtimestamp((NOW + 3 * 3600_000) / 1000, UTC)
    move = policy().decide(failure(Retry(at=at)), NOW)
    assert move.reason == "deferred"
    assert move.records[0].topic == "acme.deferred"
    assert CODEC.decode(value(move.records[0])).not_before == NOW + 3 * 3600_000


def test_the_last_attempt_dead_letters_with_the_whole_history() -> None:
    earlier = policy().decide(failure(raised(RuntimeError("first"))), NOW)
    second = CODEC.decode(value(earlier.records[0]))
    second.attempt = 3
    move = policy().decide(failure(raised(RuntimeError("last")), second), NOW + 1)
    assert move.dead
    assert move.reason == DeadLetterReason.MAX_ATTEMPTS
    letter_record, event_record = move.records
    assert letter_record.topic == "acme.dlq"
    letter = DeadLetterCodec(CODEC.store).decode(value(letter_record))
    assert letter.reason == DeadLetterReason.MAX_ATTEMPTS
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (
        "acme.jobs.high",
        2,
        41,
    )
    assert letter.job is not None
    assert [e.message for e in letter.job.errors] == ["first", "last"]
    assert EventCodec(CODEC.store).decode(value(event_record)).kind == EventKind.DEAD


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (DeclinedError("card"), DeadLetterReason.FATAL_ERROR),
        (PayloadValidationError("pay", "missing n"), DeadLetterReason.VALIDATION_ERROR),
        (DecodeError("bad avro payload", b""), DeadLetterReason.VALIDATION_ERROR),
    ],
)
def test_fatal_and_payload_errors_are_dead_lettered_at_once(
    error: BaseException, reason: str
) -> None:
    move = policy().decide(failure(error), NOW)
    assert move.dead
    assert move.reason == reason
    letter = DeadLetterCodec(CODEC.store).decode(value(move.records[0]))
    assert letter.job is not None
    assert [e.retryable for e in letter.job.errors] == [False]


def test_a_timeout_on_the_last_attempt_is_reason_timeout() -> None:
    move = policy().decide(failure(TimeLimitError("pay", 2.0), job(attempt=3)), NOW)
    assert move.reason == DeadLetterReason.TIMEOUT


def test_undecodable_messages_keep_their_raw_bytes_and_headers() -> None:
    raw_failure = failure(
        DecodeError("not a job", b"\x00junk"),
        None,
        kind=OutcomeKind.UNDECODABLE,
        job=None,
        job_type=None,
        raw=b"\x00junk",
        raw_headers=[("trace", b"abc"), ("empty", None)],
    )
    move = policy().decide(raw_failure, NOW)
    assert move.dead
    assert len(move.records) == 1, "no event: there is no job id to key it by"
    letter = DeadLetterCodec(CODEC.store).decode(value(move.records[0]))
    assert letter.reason == DeadLetterReason.DECODE_ERROR
    assert letter.raw_value == b"\x00junk"
    assert letter.raw_key == b"k"
    assert letter.raw_headers == {"trace": b"abc", "empty": b""}
    assert letter.job is None


def test_events_off_writes_only_the_move() -> None:
    move = policy(events=False).decide(failure(raised(RuntimeError())), NOW)
    assert [r.topic for r in move.records] == ["acme.retry.0"]


def test_traceback_digest_names_the_shape_of_the_failure_not_its_values() -> None:
    def fail(value: int) -> None:
        raise ValueError(value)

    digests = set()
    for value in (1, 2):
        try:
            fail(value)
        except ValueError as exc:
            digests.add(traceback_digest(exc))
    assert len(digests) == 1
    assert traceback_digest(ValueError("never raised")) is None


def _note(done: list[tuple[int, bool]], offset: int, ok: bool) -> None:
    done.append((offset, ok))


def _run_ready(loop: asyncio.AbstractEventLoop) -> None:
    """Run the callbacks already queued on ``loop`` (the mover's ``done`` calls), then return."""
    loop.call_soon(loop.stop)
    loop.run_forever()


def test_a_full_partition_still_moves_the_job_at_its_commit_point() -> None:
    """With MAX_MOVED moves above the commit point, the job *at* the commit point must still
    move (else nothing could ever advance the commit point: a deadlock); others wait."""
    from pipeline_worker.commit.marks import MAX_MOVED
    from pipeline_worker.commit.moves import Mover
    from pipeline_worker.route.policy import Record

    class FakeProducer:
        def __init__(self, conf: object) -> None:
            self.produced: list[str] = []

        def init_transactions(self, timeout: float) -> None: ...

        def begin_transaction(self) -> None: ...

        def produce(self, topic: str, value: bytes, key: bytes, headers: object = None) -> None:
            self.produced.append(topic)

        def poll(self, timeout: float) -> int:
            return 0

    loop = asyncio.new_event_loop()
    try:
        from pipeline import Settings

        mover = Mover(Settings(), loop, producer_factory=FakeProducer)  # type: ignore[arg-type]
        where = ("acme.jobs.default", 0)
        mover.moved[where] = set(range(101, 101 + MAX_MOVED))
        done: list[tuple[int, bool]] = []
        record = [Record("acme.dlq", b"x", None)]
        for offset in (500, 100):
            mover.submit(where, offset, record, functools.partial(_note, done, offset))
        mover.drain(lambda w: True, lambda w: 100)
        _run_ready(loop)
        assert done == [(100, True)], "only the job at the commit point moved"
        mover.drain(lambda w: True, lambda w: 600)  # the commit point passed the others
        _run_ready(loop)
        assert done == [(100, True), (500, True)]
    finally:
        loop.close()


def _declared(max_attempts: int | None) -> JobType:
    return JobType("pay", handler, JobOptions(max_attempts=max_attempts, backoff=Backoff(jitter=0)))


@pytest.mark.parametrize(
    ("declared", "envelope", "runs"),
    [
        (2, 5, 2),  # a producer that does not know the type wrote the schema's default
        (2, 8, 2),  # the type's limit is a ceiling
        (4, 1, 1),  # a producer may ask for fewer runs
        (None, 3, 3),  # a type that declares nothing: the envelope decides
    ],
)
def test_a_job_runs_at_most_the_smaller_of_its_type_s_and_its_envelope_s_max_attempts(
    declared: int | None, envelope: int, runs: int
) -> None:
    job_type = _declared(declared)
    moves = [
        policy().decide(
            failure(ValueError("no"), job(attempt, max_attempts=envelope), job_type=job_type), NOW
        )
        for attempt in range(1, runs + 1)
    ]
    assert [move.dead for move in moves] == [False] * (runs - 1) + [True]
    assert moves[-1].reason == DeadLetterReason.MAX_ATTEMPTS


def test_a_job_far_ahead_of_its_not_before_is_deferred_unchanged() -> None:
    early = job()
    early.not_before = NOW + 60_000
    move = policy().defer(early, b"k")
    [record] = move.records
    assert (record.topic, record.key, move.dead, move.reason) == (
        "acme.deferred",
        b"k",
        False,
        "deferred",
    )
    assert record.value is not None
    assert CODEC.decode(record.value) == early


def _raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as exc:
        return exc


def test_a_dead_letter_carries_its_last_error_s_traceback_text() -> None:
    move = policy().decide(failure(_raised(DeclinedError("declined"))), NOW)
    letter = DeadLetterCodec(CODEC.store).decode(move.records[0].value or b"")
    assert letter.traceback is not None
    assert letter.traceback.startswith("Traceback (most recent call last):\n")
    assert "in _raised\n" in letter.traceback
    assert letter.traceback.endswith("DeclinedError: declined\n")


def test_a_long_traceback_is_cut_to_its_last_8_kb() -> None:
    error = _raised(ValueError("é" * 9000 + " END"))  # two bytes each: cut inside one of them
    text = traceback_text(error)
    assert text is not None
    assert text.startswith("...\n")
    assert text.endswith("é" * 100 + " END\n")
    assert 8190 <= len(text.encode()) <= 8192
    assert traceback_text(ValueError("never raised")) is None
    assert traceback_text(None) is None


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


@pytest.mark.parametrize("error", [UnprintableError(), OSError("no file b'\udcff.txt'")])
@pytest.mark.parametrize("attempt", [1, 3])
def test_an_error_that_cannot_be_printed_or_encoded_still_moves_its_job(
    error: BaseException, attempt: int
) -> None:
    """Its move failed to build: the offset stayed unfinished and held its partition back."""
    move = policy().decide(failure(raised(error), job(attempt)), NOW)
    assert move.dead is (attempt == 3)
    moved = CODEC.decode(value(move.records[0])) if not move.dead else None
    if move.dead:
        letter = DeadLetterCodec(CODEC.store).decode(value(move.records[0]))
        assert letter.traceback is not None
        assert type(error).__name__ in letter.traceback
        moved = letter.job
    assert moved is not None
    assert moved.errors[-1].message


@pytest.mark.parametrize("attempt", [1, 3], ids=["retried", "dead"])
def test_a_job_id_too_large_for_its_event_moves_the_job_without_its_event(attempt: int) -> None:
    # Another producer may write a job whose id alone takes most of a message: its event (the
    # id as its key and in its value) would not fit, and Kafka would refuse the whole move.
    max_bytes = 1_000_000
    huge = dataclasses.replace(job(attempt), id="i" * 600_000)
    decided = FailurePolicy(
        "acme", TIERS, codec=CODEC, worker="host:1", events=True, max_bytes=max_bytes
    ).decide(failure(raised(RuntimeError("boom")), huge, key=None), NOW)
    assert [record.topic for record in decided.records] == [
        "acme.dlq" if attempt == 3 else "acme.retry.0"
    ]
    for record in decided.records:
        assert len(value(record)) + len(record.key or b"") <= max_bytes
