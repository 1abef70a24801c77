"""The producer side of the application object, against the in-memory transport."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError

from pipeline import (
    ConfigurationError,
    EnqueueError,
    JobContext,
    KafkaUnavailableError,
    PayloadValidationError,
    Pipeline,
    PipelineError,
    Priority,
    Settings,
)
from pipeline._codec import JobCodec
from pipeline._job import Job, due_at_ms, due_in_ms, now_ms
from pipeline.testing import InMemoryTransport
from pipeline_cli import cli


@pytest.fixture
def transport() -> InMemoryTransport:
    return InMemoryTransport(partitions=6)


@pytest.fixture
def app(transport: InMemoryTransport) -> Pipeline:
    return Pipeline(Settings(namespace="acme"), transport=transport)


def test_enqueue_unregistered_type_sends_json_to_default_priority(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    job_id = app.enqueue("email.send", {"to": "a@b.c", "n": 3})
    app.flush()
    [job] = transport.jobs("acme.jobs.default")
    assert job.id == job_id
    assert job.type == "email.send"
    assert json.loads(job.payload) == {"to": "a@b.c", "n": 3}
    assert job.priority is Priority.DEFAULT
    assert job.attempt == 1
    assert job.max_attempts == app.settings.producer.default_max_attempts
    assert job.not_before is None
    assert transport.messages[0].key is None


def test_registered_type_uses_its_options_and_checks_the_signature(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    @app.job("report.build", priority="high", max_attempts=2)
    def build(report_id: int, fmt: str = "pdf") -> str:
        return f"{report_id}.{fmt}"

    assert build(7) == "7.pdf"  # still a plain function
    build.enqueue(report_id=7)
    app.flush()
    [job] = transport.jobs("acme.jobs.high")
    assert (job.type, job.max_attempts, json.loads(job.payload)) == (
        "report.build",
        2,
        {"report_id": 7},
    )

    with pytest.raises(PayloadValidationError, match=r"report\.build"):
        build.enqueue(fmt="csv")  # type: ignore[call-arg]  # missing report_id
    with pytest.raises(PayloadValidationError, match="unexpected"):
        build.enqueue(report_id=1, colour="red")  # type: ignore[call-arg]
    app.flush()
    assert len(transport.messages) == 1, "an invalid payload must send nothing"


def test_signature_checks_cover_kwargs_and_positional_only(app: Pipeline) -> None:
    @app.job("open")
    def open_ended(a: int, **rest: object) -> None: ...

    @app.job("positional")
    def positional(a: int, /) -> None: ...

    open_ended.enqueue(a=1, anything="goes")
    with pytest.raises(PayloadValidationError, match="'a'"):
        open_ended.enqueue(b=2)  # type: ignore[call-arg]
    with pytest.raises(PayloadValidationError, match="positional"):
        positional.enqueue(a=1)  # type: ignore[call-arg]


def test_ctx_parameter_is_not_a_payload_field(app: Pipeline) -> None:
    @app.job("ctx.job")
    def handler(x: int, ctx: object) -> None: ...

    @app.job("ctx.first")
    def first(ctx: JobContext, x: int) -> None: ...

    # A ctx after other parameters is no payload field either (mypy needs the pipeline.mypy
    # plugin to drop it from .enqueue's signature: docs/failures.md).
    handler.enqueue(x=1)
    with pytest.raises(PayloadValidationError):
        handler.enqueue()  # type: ignore[call-arg]
    first.enqueue(x=1)
    first.enqueue(2)  # positional arguments fill the fields after ctx
    with pytest.raises(PayloadValidationError):
        first.enqueue()  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (["not", "a", "mapping"], "mapping"),
        ({"when": datetime(2026, 1, 1)}, "when"),
        ({1: "int key"}, "key"),
    ],
)
def test_invalid_payloads_raise_and_send_nothing(
    app: Pipeline, transport: InMemoryTransport, payload: object, message: str
) -> None:
    with pytest.raises(PayloadValidationError, match=message):
        app.enqueue("x", payload)  # type: ignore[arg-type]
    app.flush()
    assert transport.messages == []


@pytest.mark.parametrize(
    ("job_type", "options", "message"),
    [
        ("", {}, "job type must not be empty"),
        ("  ", {}, "job type must not be empty"),
        ("t", {"idempotency_key": ""}, "idempotency key must not be empty"),
        ("t", {"idempotency_key": " "}, "idempotency key must not be empty"),
    ],
)
def test_a_blank_job_type_or_idempotency_key_is_refused_and_nothing_is_sent(
    app: Pipeline, transport: InMemoryTransport, job_type: str, options: Any, message: str
) -> None:
    """An unset variable passed as a key would make every job but the first a duplicate."""
    with pytest.raises(ConfigurationError, match=message):
        app.enqueue(job_type, {}, **options)
    with pytest.raises(ConfigurationError, match=message):
        app.enqueue_many(job_type, [{}], **options)
    app.flush()
    assert transport.messages == []


def test_keys_route_by_idempotency_key_then_key(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    app.enqueue("t", {}, key="order-1")
    app.enqueue("t", {}, key="order-1", idempotency_key="charge-9")
    app.enqueue("t", {}, key=b"raw")
    app.flush()
    assert [m.key for m in transport.messages] == [b"order-1", b"charge-9", b"raw"]
    [_, keyed, _] = transport.jobs("acme.jobs.default")
    assert keyed.idempotency_key == "charge-9"


def test_same_key_same_partition(app: Pipeline, transport: InMemoryTransport) -> None:
    for _ in range(20):
        app.enqueue("t", {}, key="customer-42")
    app.flush()
    assert len({m.partition for m in transport.messages}) == 1


def test_delay_and_run_at_go_to_the_deferred_topic(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    before = now_ms()
    app.enqueue("t", {}, delay=30, priority="low")
    at = datetime.now(UTC) + timedelta(hours=1)
    app.enqueue("t", {}, run_at=at)
    app.enqueue("t", {}, run_at=datetime.now(UTC) - timedelta(minutes=1))  # already due
    app.flush()
    delayed, scheduled = transport.jobs("acme.deferred")
    assert delayed.priority is Priority.LOW
    assert delayed.not_before is not None
    # Cut to milliseconds, due times round up: never early.
    assert before + 30_000 <= delayed.not_before <= now_ms() + 30_001
    whole_seconds_ms = int(at.replace(microsecond=0).timestamp()) * 1000
    assert scheduled.not_before == whole_seconds_ms + -(-at.microsecond // 1000)
    assert len(transport.jobs("acme.jobs.default")) == 1


@pytest.mark.parametrize("delay", [-1.0, float("nan"), float("inf"), 1e17])
def test_a_delay_no_job_could_carry_is_refused_at_enqueue(
    app: Pipeline, transport: InMemoryTransport, delay: float
) -> None:
    with pytest.raises(ConfigurationError, match="delay must"):
        app.enqueue("t", {}, delay=delay)
    app.flush()
    assert transport.messages == []


def test_a_delay_or_run_at_python_cannot_take_is_a_configuration_error(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    """A bare OverflowError and TypeError came out of the due-time arithmetic."""

    class NoOffset(tzinfo):
        def utcoffset(self, dt: datetime | None) -> timedelta | None:
            return None

        def dst(self, dt: datetime | None) -> timedelta | None:
            return None

        def tzname(self, dt: datetime | None) -> str | None:
            return None

    with pytest.raises(ConfigurationError, match="delay is too large"):
        app.enqueue("t", {}, delay=10**400)
    with pytest.raises(ConfigurationError, match="run_at must be timezone-aware"):
        app.enqueue("t", {}, run_at=datetime(2030, 1, 1, tzinfo=NoOffset()))
    app.flush()
    assert transport.messages == []


def test_a_due_time_is_never_before_the_delay_or_run_at_asked_for(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    # The due times as a caller computes them: a float of seconds, taken before the call.
    asked: list[float] = []
    for i in range(300):
        delay = 2.0 + i / 97.0
        asked.append(time.time() + delay)
        app.enqueue("t", {}, delay=delay)
    for i in range(300):
        at = datetime.now(UTC) + timedelta(seconds=2, microseconds=i * 37)
        asked.append(at.timestamp())
        app.enqueue("t", {}, run_at=at)
    app.flush()
    jobs = transport.jobs("acme.deferred")
    early = [
        (due, job.not_before)
        for due, job in zip(asked, jobs, strict=True)
        if job.not_before is None or job.not_before / 1000 < due
    ]
    assert not early


def test_due_times_round_up_to_the_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time_ns", lambda: 1_700_000_000_000_400_000)
    assert due_in_ms(0.0) == 1_700_000_000_001
    assert due_in_ms(2.0) == 1_700_000_002_001
    assert due_in_ms(1.9995) == 1_700_000_002_000
    assert due_in_ms(1.9996) == 1_700_000_002_000  # exactly due: not later
    assert due_in_ms(1.99961) == 1_700_000_002_001
    at = datetime(2030, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    assert due_at_ms(at) == int(at.replace(microsecond=0).timestamp()) * 1000 + 1
    assert due_at_ms(at.replace(microsecond=0)) == int(at.replace(microsecond=0).timestamp()) * 1000


@pytest.mark.parametrize(
    "options",
    [
        {"delay": 5, "run_at": datetime.now(UTC)},
        {"delay": -1},
        {"run_at": datetime(2030, 1, 1)},  # naive
        {"priority": "urgent"},
        {"max_attempts": 0},
    ],
)
def test_bad_options_are_rejected(app: Pipeline, options: dict[str, Any]) -> None:
    with pytest.raises((ConfigurationError, ValueError)):
        app.enqueue("t", {}, **options)


def test_unknown_option_is_a_clear_type_error(app: Pipeline) -> None:
    with pytest.raises(TypeError, match="priorty"):
        app.enqueue("t", {}, priorty="high")


def test_enqueue_many_keeps_order_and_with_options(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    @app.job("bulk")
    def bulk(i: int) -> None: ...

    ids = bulk.with_options(priority="critical", tenant="acme-co").enqueue_many(
        {"i": i} for i in range(50)
    )
    app.flush()
    jobs = transport.jobs("acme.jobs.critical")
    assert [j.id for j in jobs] == ids
    assert len(set(ids)) == 50
    assert [json.loads(j.payload)["i"] for j in jobs] == list(range(50))
    assert {j.tenant for j in jobs} == {"acme-co"}


def test_headers_are_carried(app: Pipeline, transport: InMemoryTransport) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    app.enqueue("t", {}, headers={"traceparent": traceparent})
    app.flush()
    assert transport.jobs("acme.jobs.default")[0].headers == {"traceparent": traceparent}


def test_flush_reports_refused_jobs() -> None:
    transport = InMemoryTransport(fail_with=KafkaError.MSG_SIZE_TOO_LARGE)
    app = Pipeline(Settings(), transport=transport)
    job_id = app.enqueue("t", {})
    with pytest.raises(EnqueueError) as info:
        app.flush()
    assert info.value.job_id == job_id
    app.flush()  # reported once


def test_flush_reports_missing_topics_with_the_fix() -> None:
    app = Pipeline(Settings(), transport=InMemoryTransport(fail_with=KafkaError._UNKNOWN_TOPIC))
    app.enqueue("t", {})
    with pytest.raises(EnqueueError, match="pipeline topics apply"):
        app.flush()


def test_timed_out_delivery_is_kafka_unavailable() -> None:
    app = Pipeline(Settings(), transport=InMemoryTransport(fail_with=KafkaError._MSG_TIMED_OUT))
    app.enqueue("t", {})
    with pytest.raises(KafkaUnavailableError, match=r"localhost:9092.*running"):
        app.flush()


def test_submit_handle_reports_partition_and_offset(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    handle = app.submit("t", {"a": 1}, key="k")
    assert not handle.done()
    handle.wait(timeout=1)
    assert handle.done()
    assert handle.partition == transport.messages[0].partition
    assert handle.offset == 0
    assert app.enqueue("t", {}, wait=True)


def test_submit_handle_raises_on_failure() -> None:
    app = Pipeline(Settings(), transport=InMemoryTransport(fail_with=KafkaError._MSG_TIMED_OUT))
    with pytest.raises(KafkaUnavailableError):
        app.enqueue("t", {}, wait=True)


def test_job_ids_are_unique_and_time_ordered(app: Pipeline) -> None:
    ids = app.enqueue_many("t", ({} for _ in range(1000)))
    assert len(set(ids)) == 1000
    assert all(len(i) == 32 for i in ids)
    assert ids[0][:12] <= ids[-1][:12]


def test_duplicate_registration_is_refused(app: Pipeline) -> None:
    @app.job("dup")
    def first() -> None: ...

    with pytest.raises(ConfigurationError, match="dup"):

        @app.job("dup")
        def second() -> None: ...


def test_bad_job_options_are_refused(app: Pipeline) -> None:
    with pytest.raises(ConfigurationError):
        app.job("bad", concurrency=0)
    with pytest.raises(ConfigurationError, match="retries"):
        app.job("bad", retries=3)


class _BatchRecorder(InMemoryTransport):
    """The in-memory transport with ``produce_many``, recording each call's size."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []
        self.polls_after: list[int] = []

    def produce_many(
        self, topic: str, values: list[bytes], key: bytes | None, on_delivery: Any
    ) -> None:
        self.batches.append(len(values))
        for value in values:
            self.produce(topic, value, key, on_delivery)

    def poll(self, timeout: float = 0) -> int:
        self.polls_after.append(len(self.batches))
        return super().poll(timeout)


def test_enqueue_many_hands_the_transport_batches_and_serves_callbacks_between_them() -> None:
    transport = _BatchRecorder()
    app = Pipeline(Settings(namespace="acme"), transport=transport)
    ids = app.enqueue_many("bulk", ({"i": i} for i in range(2500)))
    assert transport.batches == [1000, 1000, 500]
    assert transport.polls_after[:2] == [1, 2]  # delivery callbacks served after each batch
    app.flush()
    jobs = transport.jobs("acme.jobs.default")
    assert [j.id for j in jobs] == ids
    assert [json.loads(j.payload)["i"] for j in jobs] == list(range(2500))


@pytest.mark.parametrize("bad_at", [0, 7, 1000, 1500])
def test_enqueue_many_sends_the_jobs_before_a_bad_payload_and_none_after(
    app: Pipeline, transport: InMemoryTransport, bad_at: int
) -> None:
    payloads: list[Any] = [{"i": i} for i in range(1600)]
    payloads[bad_at] = {"i": float("nan")}
    with pytest.raises(PayloadValidationError, match="field 'i'") as caught:
        app.enqueue_many("bulk", payloads)
    app.flush()
    sent = transport.jobs("acme.jobs.default")
    assert [json.loads(j.payload)["i"] for j in sent] == list(range(bad_at))
    # The error names the failing payload and carries what was sent before it.
    error = caught.value
    assert (error.job_type, error.index) == ("bulk", bad_at)
    assert error.enqueued_ids == [j.id for j in sent]
    assert str(error).startswith(
        f"invalid payload for job type 'bulk': job #{bad_at} of the batch (the {bad_at} before "
        "it were enqueued, it and the ones after it were not): "
    )


def test_enqueue_many_names_the_failing_payload_of_a_registered_type_with_its_fields(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    @app.job("report.build")
    def build(report_id: int) -> None:
        return None

    payloads = ({"report_id": n} if n != 2 else {"report_id": "two"} for n in range(4))
    with pytest.raises(PayloadValidationError) as caught:
        app.enqueue_many("report.build", payloads)
    error = caught.value
    assert error.index == 2
    assert "'report.build': job #2 of the batch" in str(error)
    [field] = error.errors
    assert field.startswith("report_id:")
    app.flush()
    assert error.enqueued_ids == [j.id for j in transport.jobs("acme.jobs.default")]
    assert len(error.enqueued_ids) == 2
    with pytest.raises(PayloadValidationError) as single:
        app.enqueue("report.build", {"report_id": "two"})
    assert (single.value.index, single.value.enqueued_ids) == (None, [])


class _RefusingSecondBatch(_BatchRecorder):
    def produce_many(
        self, topic: str, values: list[bytes], key: bytes | None, on_delivery: Any
    ) -> None:
        if self.batches:
            self.batches.append(len(values))
            raise PipelineError("Kafka refused the batch")
        super().produce_many(topic, values, key, on_delivery)


def test_a_batch_the_producer_refused_is_not_sent_again() -> None:
    transport = _RefusingSecondBatch()
    app = Pipeline(Settings(namespace="acme"), transport=transport)
    with pytest.raises(PipelineError, match="refused the batch"):
        app.enqueue_many("bulk", ({"i": i} for i in range(2500)))
    assert transport.batches == [1000, 1000]  # the second one refused, once; no third


def test_enqueue_without_options_encodes_the_envelope_of_a_type_once(
    app: Pipeline, transport: InMemoryTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A single enqueue fills its type's template as enqueue_many does: what it sends is
    # byte for byte the envelope the codec writes, with the codec itself called only once.
    encoded: list[str] = []
    encode = app.codec.encode

    def counted(job: Job) -> bytes:
        encoded.append(job.id)
        return encode(job)

    monkeypatch.setattr(app.codec, "encode", counted)
    ids = [app.enqueue("email.send", {"n": n}) for n in range(3)]
    made = len(encoded)
    ids += [app.enqueue("email.send", {"n": n}) for n in range(3, 6)]
    assert len(encoded) == made  # nothing encoded again for the later jobs
    assert not set(encoded) & set(ids)
    app.flush()
    jobs = transport.jobs("acme.jobs.default")
    assert [job.id for job in jobs] == ids
    assert [json.loads(job.payload) for job in jobs] == [{"n": n} for n in range(6)]
    codec = JobCodec()
    for job, sent in zip(jobs, transport.messages, strict=True):
        assert sent.value == codec.encode(job)
        assert job.id[:12] == f"{job.created_at:012x}"  # one clock reading for id and time


def test_a_type_registered_after_its_first_enqueue_is_sent_with_its_options(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    app.enqueue("report.build", {"report_id": 1})

    @app.job("report.build", priority="high", max_attempts=2)
    def build(report_id: int) -> None:
        return None

    app.enqueue("report.build", {"report_id": 2})
    with pytest.raises(PayloadValidationError):
        app.enqueue("report.build", {"report_id": "three"})
    app.flush()
    [before] = transport.jobs("acme.jobs.default")
    [after] = transport.jobs("acme.jobs.high")
    assert (before.max_attempts, after.max_attempts) == (
        app.settings.producer.default_max_attempts,
        2,
    )
    assert json.loads(after.payload) == {"report_id": 2}


def test_the_enqueue_command_refuses_a_blank_idempotency_key_as_a_usage_error() -> None:
    result = CliRunner().invoke(
        cli, ["enqueue", "t", "--payload", "{}", "--idempotency-key", "", "--timeout", "1"]
    )
    assert result.exit_code == 2, result.output
    assert "idempotency key must not be empty" in result.output


def test_the_enqueue_command_names_the_priorities_it_takes() -> None:
    result = CliRunner().invoke(
        cli, ["enqueue", "t", "--payload", "{}", "--priority", "urgent", "--timeout", "1"]
    )
    assert result.exit_code == 2, result.output
    assert "'urgent' is not one of 'critical', 'high', 'default', 'low'" in result.output


@pytest.mark.parametrize("option", ["time_limit", "rate_limit", "dedup_ttl"])
@pytest.mark.parametrize("value", ["forever", True, [30]])
def test_a_number_option_given_something_else_is_named(
    app: Pipeline, option: str, value: object
) -> None:
    """It was "bad option for @app.job: '<' not supported between instances of 'int' and
    'str'"."""
    with pytest.raises(ConfigurationError, match=f"^{option} must be a number, got "):
        app.job("bad", **{option: value})
