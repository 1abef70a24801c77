"""What enqueue refuses before anything is sent: payloads that are no mapping, mistyped options."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from typing import Any

import pytest

from pipeline import (
    ConfigurationError,
    JobOptions,
    PayloadValidationError,
    Pipeline,
    Priority,
    Settings,
)
from pipeline.testing import InMemoryTransport


@pytest.fixture
def transport() -> InMemoryTransport:
    return InMemoryTransport(partitions=3)


@pytest.fixture
def app(transport: InMemoryTransport) -> Pipeline:
    return Pipeline(Settings(namespace="acme"), transport=transport)


@pytest.mark.parametrize("payload", [[], (), "", 0, False])
def test_an_empty_payload_that_is_no_mapping_is_refused_as_enqueue_many_refuses_it(
    app: Pipeline, transport: InMemoryTransport, payload: Any
) -> None:
    with pytest.raises(PayloadValidationError, match="must be a mapping"):
        app.enqueue_many("t", [payload])
    with pytest.raises(PayloadValidationError, match="must be a mapping"):
        app.enqueue("t", payload)
    with pytest.raises(PayloadValidationError, match="must be a mapping"):
        app.enqueue("t", payload, priority="high")
    with pytest.raises(PayloadValidationError, match="must be a mapping"):
        app.submit("t", payload)
    app.flush()
    assert transport.messages == []


def test_no_payload_is_an_empty_one(app: Pipeline, transport: InMemoryTransport) -> None:
    app.enqueue("t")
    app.enqueue("t", None, priority="high")
    app.flush()
    assert [m.value.endswith(b"") for m in transport.messages] == [True, True]
    assert [j.payload for j in transport.jobs("acme.jobs.default")] == [b"{}"]
    assert [j.payload for j in transport.jobs("acme.jobs.high")] == [b"{}"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"headers": {"attempt": 3}}, r"headers must map strings to strings.*'attempt': 3"),
        ({"headers": {1: "a"}}, r"headers must map strings to strings.*1: 'a'"),
        ({"headers": [("a", "b")]}, "headers must map strings to strings"),
        ({"max_attempts": 2.5}, "max_attempts must be an int, got 2.5"),
        ({"max_attempts": "3"}, "max_attempts must be an int, got '3'"),
        ({"max_attempts": True}, "max_attempts must be an int, got True"),
        ({"max_attempts": 2**31}, r"max_attempts must be at most 2147483647"),
        ({"idempotency_key": 42}, "idempotency_key must be a str, got 42"),
        ({"tenant": 7}, "tenant must be a str, got 7"),
        ({"key": 123}, "key must be a str or bytes, got 123"),
        ({"delay": "30"}, "delay must be a number of seconds or a timedelta, got '30'"),
        ({"delay": True}, "delay must be a number of seconds or a timedelta, got True"),
        ({"run_at": date(2030, 1, 1)}, "run_at must be a datetime"),
        ({"run_at": "2030-01-01T00:00:00Z"}, "run_at must be a datetime"),
    ],
)
def test_a_mistyped_option_is_a_configuration_error_naming_it(
    app: Pipeline, transport: InMemoryTransport, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        app.enqueue("t", {}, **options)
    with pytest.raises(ConfigurationError, match=message):
        app.enqueue_many("t", [{}], **options)

    @app.job("typed")
    def typed() -> None: ...

    with pytest.raises(ConfigurationError, match=message):
        typed.with_options(**options)
    app.flush()
    assert transport.messages == []


PRIORITIES = "unknown priority 'urgent'; use one of: critical, high, default, low"


def test_an_unknown_priority_is_a_configuration_error_naming_the_valid_ones(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    # It was a bare ValueError: no PipelineError, so `except PipelineError` let it through.
    @app.job("typed")
    def typed() -> None: ...

    calls: list[Callable[[], object]] = [
        lambda: app.enqueue("t", {}, priority="urgent"),
        lambda: app.enqueue("t", {}, priority="urgent", wait=True),
        lambda: app.submit("t", {}, priority="urgent"),
        lambda: app.enqueue_many("t", [{}], priority="urgent"),
        lambda: typed.with_options(priority="urgent").enqueue(),
        lambda: app.job("other", priority="urgent"),
    ]
    for call in calls:
        with pytest.raises(ConfigurationError, match=PRIORITIES) as caught:
            call()
        assert isinstance(caught.value, ValueError)  # what it was, for those who caught that
    app.flush()
    assert transport.messages == []


def test_well_typed_options_are_taken(app: Pipeline, transport: InMemoryTransport) -> None:
    app.enqueue(
        "t",
        {},
        headers={"traceparent": "00-ab"},
        max_attempts=2**31 - 1,
        idempotency_key="k",
        tenant="acme",
        delay=1.5,
    )
    app.enqueue("t", {}, key=b"raw", run_at=None)
    app.enqueue("t", {}, key="k", run_at=datetime(2020, 1, 1, tzinfo=UTC))
    app.enqueue("t", {}, headers={"source": _Source.BILLING}, delay=0)  # str subclasses are str
    app.flush()
    [deferred] = transport.jobs("acme.deferred")
    assert deferred.headers == {"traceparent": "00-ab"}
    assert transport.jobs("acme.jobs.default")[-1].headers == {"source": "billing"}
    assert deferred.max_attempts == 2**31 - 1
    assert len(transport.jobs("acme.jobs.default")) == 3


@pytest.mark.parametrize("delay", [0, 0.0, timedelta(0)])
def test_a_zero_delay_is_no_delay_and_needs_no_scheduler(
    app: Pipeline, transport: InMemoryTransport, delay: float | timedelta
) -> None:
    # Its due time rounds up to the next millisecond, which made it a job for the scheduler.
    for _ in range(20):
        app.enqueue("t", {}, delay=delay)
    app.flush()
    assert transport.jobs("acme.deferred") == []
    assert len(transport.jobs("acme.jobs.default")) == 20


class _Source(StrEnum):
    BILLING = "billing"


def test_enqueue_many_refuses_one_idempotency_key_for_every_job(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    # Every job of the batch carried the key, so the workers ran the first and dropped the
    # rest as its duplicates, without a word to the caller.
    @app.job("charge")
    def charge(order: int) -> None: ...

    message = "one idempotency key for every job of enqueue_many"
    with pytest.raises(ConfigurationError, match=message):
        app.enqueue_many("charge", [{"order": 1}, {"order": 2}], idempotency_key="batch-7")
    with pytest.raises(ConfigurationError, match=message):
        charge.with_options(idempotency_key="batch-7").enqueue_many([{"order": 1}])
    app.enqueue_many("charge", [{"order": 1}, {"order": 2}], key="batch-7")  # a key is fine
    app.flush()
    assert [job.idempotency_key for job in transport.jobs("acme.jobs.default")] == [None, None]


MAX_BYTES = 10_000
"""A small ``message.max.bytes``, so that a job too large to send stays small."""


def _small_messages(transport: InMemoryTransport) -> Pipeline:
    settings = Settings(namespace="acme", kafka={"message.max.bytes": str(MAX_BYTES)})
    return Pipeline(settings, transport=transport)


def test_a_job_larger_than_the_producer_sends_is_refused_naming_its_type_and_what_to_do(
    transport: InMemoryTransport,
) -> None:
    app = _small_messages(transport)
    with pytest.raises(PayloadValidationError) as caught:
        app.enqueue("report.build", {"blob": "x" * MAX_BYTES})
    message = str(caught.value)
    assert caught.value.job_type == "report.build"
    assert "'report.build'" in message
    assert f"more than the {MAX_BYTES:,} the producer sends (message.max.bytes)" in message
    assert "keep large data elsewhere and pass a reference" in message
    with pytest.raises(PayloadValidationError, match=r"message\.max\.bytes"):
        app.submit("report.build", {"blob": "x" * MAX_BYTES})
    with pytest.raises(PayloadValidationError, match=r"message\.max\.bytes"):
        app.enqueue("report.build", {"blob": "x" * MAX_BYTES}, priority="high")
    app.flush()
    assert transport.messages == []


def test_a_job_that_fits_is_sent_as_before(transport: InMemoryTransport) -> None:
    app = _small_messages(transport)
    job_id = app.enqueue("report.build", {"blob": "x" * (MAX_BYTES // 2)})
    [job] = transport.jobs("acme.jobs.default")
    assert job.id == job_id


@pytest.mark.parametrize("big_at", [0, 5, 1000, 1003])
def test_enqueue_many_sends_the_jobs_before_one_too_large_and_names_its_index(
    transport: InMemoryTransport, big_at: int
) -> None:
    app = _small_messages(transport)
    payloads: list[dict[str, Any]] = [{"i": i} for i in range(1010)]
    payloads[big_at] = {"i": big_at, "blob": "x" * MAX_BYTES}
    with pytest.raises(PayloadValidationError) as caught:
        app.enqueue_many("report.build", payloads)
    assert caught.value.job_type == "report.build"
    assert f"job #{big_at} of the batch (the {big_at} before it were enqueued" in str(caught.value)
    assert "message.max.bytes" in str(caught.value)
    app.flush()
    sent = transport.jobs("acme.jobs.default")
    assert [json.loads(job.payload)["i"] for job in sent] == list(range(big_at))
    assert caught.value.index == big_at
    assert caught.value.enqueued_ids == [job.id for job in sent]


def test_the_enqueue_bound_is_librdkafkas_own() -> None:
    """A job librdkafka takes is taken: the bound was 512 bytes under the limit, which refused
    jobs that producers sent before (librdkafka refuses a record only past its own overhead)."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    from pipeline._producer import PRODUCE_OVERHEAD

    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "message.max.bytes": 100_000})
    producer.produce("t", b"x" * (100_000 - PRODUCE_OVERHEAD - 5), b"k" * 5)  # taken
    with pytest.raises(KafkaException) as refused:
        producer.produce("t", b"x" * (100_000 - PRODUCE_OVERHEAD - 4), b"k" * 5)
    assert refused.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    producer.purge()
    producer.flush(0)


def test_job_options_made_directly_check_their_priority_too() -> None:
    # `JobType(name, handler, JobOptions(priority="urgent"))` skipped the check of @app.job and
    # failed later, at the first enqueue, as a bare ValueError far from the mistake.
    assert JobOptions(priority="high").priority is Priority.HIGH  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=PRIORITIES):
        JobOptions(priority="urgent")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rate_limit": 5e-324}, "rate_limit must be from 1e-06 to 1e"),  # a share rounds to 0
        ({"rate_limit": 1e308}, "rate_limit must be from"),  # its token bucket overflows
        ({"rate_limit": float("nan")}, "rate_limit must be from"),
        ({"rate_limit": 0.0}, "rate_limit must be from"),
        ({"time_limit": float("inf")}, "time_limit must be positive"),
        ({"time_limit": float("nan")}, "time_limit must be positive"),
        # Taken, then every enqueue failed to encode the envelope's attempt count.
        ({"max_attempts": 2**31}, "max_attempts must be at most 2147483647"),
        ({"max_attempts": 1.5}, "max_attempts must be a whole number"),
        ({"concurrency": True}, "concurrency must be a whole number"),
    ],
)
def test_job_options_refuse_limits_a_worker_cannot_keep(
    options: dict[str, float], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        JobOptions(**options)  # type: ignore[arg-type]
    assert JobOptions(rate_limit=1 / 3600, time_limit=0.5).rate_limit == 1 / 3600


@pytest.mark.parametrize(
    ("options", "what"),
    [({"idempotency_key": "order-\ud800"}, "an idempotency key"), ({"key": "\udcff"}, "a key")],
)
def test_a_key_utf8_cannot_encode_is_a_configuration_error_naming_it(
    app: Pipeline, transport: InMemoryTransport, options: dict[str, Any], what: str
) -> None:
    """A lone surrogate (os.fsdecode makes them of undecodable bytes) raised a bare
    UnicodeEncodeError from deep inside the enqueue."""
    with pytest.raises(ConfigurationError, match=f"^{what} must be text that UTF-8 can encode"):
        app.enqueue("t", {}, **options)
    with pytest.raises(ConfigurationError, match="lone surrogate"):
        app.submit("t", {}, **options)
    app.flush()
    assert transport.messages == []


def test_a_job_too_large_for_its_idempotency_key_names_the_key_not_the_payload(
    transport: InMemoryTransport,
) -> None:
    """The message carries the key twice (its key, and in the job): a long key with a tiny
    payload was refused as an invalid payload, told to keep large data elsewhere."""
    app = _small_messages(transport)
    key = "k" * (MAX_BYTES * 6 // 10)
    with pytest.raises(ConfigurationError) as caught:
        app.enqueue("charge", {"n": 1}, idempotency_key=key)
    message = str(caught.value)
    assert f"its idempotency key is {len(key):,} bytes, which the message carries twice" in message
    assert "pass a shorter key" in message
    assert "payload" not in message
    assert "large data" not in message
    # A large payload is still the payload's error, which tells what the key takes of it.
    with pytest.raises(PayloadValidationError) as caught_payload:
        app.enqueue("charge", {"blob": "x" * MAX_BYTES}, idempotency_key="k" * 100)
    message = str(caught_payload.value)
    assert "its idempotency key is 100 bytes, which the message carries twice, 200 bytes" in message
    assert "keep large data elsewhere" in message
    app.flush()
    assert transport.messages == []
