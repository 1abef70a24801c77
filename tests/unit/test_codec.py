"""Job and record codecs, payload codecs: exact bytes, round trips, and every way to fail."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline._avro import HEADER_SIZE, MARKER, SchemaStore
from pipeline._codec import (
    AvroPayload,
    DeadLetterCodec,
    EventCodec,
    JobCodec,
    JsonPayload,
    PayloadCodec,
    ScheduleCodec,
)
from pipeline._errors import (
    ConfigurationError,
    DecodeError,
    PayloadValidationError,
    SchemaNotFoundError,
)
from pipeline._job import AttemptError, Job, PayloadEncoding, Priority
from pipeline._records import DeadLetter, DeadLetterReason, Event, EventKind, Schedule

if TYPE_CHECKING:
    from collections.abc import Mapping

# The job of docs/wire-format.md's worked example.
GOLDEN_JOB = Job(
    id="01941f297c00a1b2000000000000002a",
    type="email.send",
    payload=b'{"to":"ada@example.com"}',
    payload_encoding=PayloadEncoding.JSON,
    priority=Priority.HIGH,
    attempt=2,
    max_attempts=5,
    created_at=1735689600000,  # 2025-01-01T00:00:00Z
    not_before=None,
    idempotency_key="welcome-ada",
    tenant=None,
    headers={"source": "signup"},
    errors=[
        AttemptError(
            attempt=1,
            at=1735689601500,
            error_class="builtins.TimeoutError",
            message="smtp timed out",
            retryable=True,
            traceback_digest=None,
            worker="w-1",
        )
    ],
)
GOLDEN_JOB_HEX = (
    "c3018dea1b6bdd77221b"  # marker + fingerprint of pipeline.Job v1
    "4030313934316632393763303061316232303030303030303030303030303032611465"
    "6d61696c2e73656e64307b22746f223a22616461406578616d706c652e636f6d227d00"
    "0868696768040a80f0cbf2836500021677656c636f6d652d61646100020c736f757263"
    "650c7369676e7570000202b887ccf283652a6275696c74696e732e54696d656f757445"
    "72726f721c736d74702074696d6564206f757401000206772d3100"
)


@pytest.fixture(scope="module")
def store() -> SchemaStore:
    return SchemaStore()


@pytest.fixture(scope="module")
def codec(store: SchemaStore) -> JobCodec:
    return JobCodec(store)


# -- golden bytes ------------------------------------------------------------------------------


def test_golden_job_bytes(codec: JobCodec) -> None:
    assert codec.encode(GOLDEN_JOB).hex() == GOLDEN_JOB_HEX
    assert codec.decode(bytes.fromhex(GOLDEN_JOB_HEX)) == GOLDEN_JOB


def _long(n: int) -> bytes:
    """Avro's zig-zag varint, from the spec, to assemble the golden body by hand."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _str(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return _long(len(raw)) + raw


def test_golden_job_bytes_follow_the_spec_field_by_field() -> None:
    """The annotated example of docs/wire-format.md, assembled from the Avro spec's rules."""
    body = b"".join(
        [
            _str("01941f297c00a1b2000000000000002a"),  # id
            _str("email.send"),  # type
            _str(b'{"to":"ada@example.com"}'),  # payload (bytes)
            _long(0),  # payload_encoding: enum index 0 = JSON
            _str("high"),  # priority
            _long(2),  # attempt
            _long(5),  # max_attempts
            _long(1735689600000),  # created_at
            _long(0),  # not_before: union branch 0 = null
            _long(1) + _str("welcome-ada"),  # idempotency_key: branch 1 = string
            _long(0),  # tenant: null
            _long(1) + _str("source") + _str("signup") + _long(0),  # headers: one block, end
            _long(1),  # errors: a block of one item
            _long(1) + _long(1735689601500) + _str("builtins.TimeoutError"),
            _str("smtp timed out") + b"\x01",  # message, retryable = true
            _long(0),  # traceback_digest: null
            _long(1) + _str("w-1"),  # worker
            _long(0),  # end of the errors array
        ]
    )
    assert (MARKER + bytes.fromhex("8dea1b6bdd77221b") + body).hex() == GOLDEN_JOB_HEX


def test_golden_json_payload() -> None:
    payload = {"to": "ada@example.com", "n": 1, "é": [1.5, None, True]}
    data = JsonPayload().encode("email.send", payload)
    assert data == '{"to":"ada@example.com","n":1,"é":[1.5,null,true]}'.encode()
    assert JsonPayload().decode("email.send", data) == payload


EMAIL_V1: dict[str, Any] = {
    "type": "record",
    "name": "EmailPayload",
    "namespace": "acme.email",
    "fields": [
        {"name": "to", "type": "string"},
        {"name": "retries", "type": "int", "default": 3},
        {"name": "cc", "type": ["null", "string"], "default": None},
    ],
}


def test_an_avsc_path_is_read_given_as_a_path_or_a_str(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "email.avsc").write_text(json.dumps(EMAIL_V1), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    expected = AvroPayload(EMAIL_V1).encode("email.send", {"to": "ada@example.com"})
    for schema in (tmp_path / "email.avsc", "email.avsc"):
        assert AvroPayload(schema).encode("email.send", {"to": "ada@example.com"}) == expected
    with pytest.raises(ConfigurationError, match=r"cannot read the schema file missing\.avsc"):
        AvroPayload("missing.avsc")


def test_golden_avro_payload() -> None:
    codec = AvroPayload(EMAIL_V1)
    data = codec.encode("email.send", {"to": "ada@example.com", "cc": "bob@example.com"})
    assert data.hex() == (
        "c301f44bbda6bc77b94d"  # marker + fingerprint of acme.email.EmailPayload
        "1e616461406578616d706c652e636f6d"  # to
        "06"  # retries: the default, 3
        "021e626f62406578616d706c652e636f6d"  # cc: branch 1, a string
    )
    assert codec.decode("email.send", data) == {
        "to": "ada@example.com",
        "retries": 3,
        "cc": "bob@example.com",
    }


# -- round trips -------------------------------------------------------------------------------

ints = st.integers(-(2**31), 2**31 - 1)
longs = st.integers(-(2**63), 2**63 - 1)
runs = st.integers(1, 2**31 - 1)  # a job's attempt and max_attempts (below 1: a decode error)
texts = st.text(max_size=40)
attempt_errors = st.builds(
    AttemptError,
    attempt=ints,
    at=longs,
    error_class=texts,
    message=texts,
    retryable=st.booleans(),
    traceback_digest=st.none() | texts,
    worker=st.none() | texts,
)
jobs = st.builds(
    Job,
    id=texts,
    type=texts,
    payload=st.binary(max_size=80),
    payload_encoding=st.sampled_from(PayloadEncoding),
    priority=st.sampled_from(Priority),
    attempt=runs,
    max_attempts=runs,
    created_at=longs,
    not_before=st.none() | longs,
    idempotency_key=st.none() | texts,
    tenant=st.none() | texts,
    headers=st.dictionaries(texts, texts, max_size=4),
    errors=st.lists(attempt_errors, max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(job=jobs)
def test_job_round_trip(codec: JobCodec, job: Job) -> None:
    data = codec.encode(job)
    assert data[:HEADER_SIZE] == codec.schema.header
    assert codec.decode(data) == job


def test_dead_letter_round_trip_with_job(store: SchemaStore) -> None:
    codec = DeadLetterCodec(store)
    letter = DeadLetter(
        reason=DeadLetterReason.MAX_ATTEMPTS,
        message="smtp timed out",
        error_class="builtins.TimeoutError",
        source_topic="pipeline.jobs.high",
        source_partition=3,
        source_offset=2**40,
        raw_key=b"welcome-ada",
        raw_headers={"traceparent": b"00-ab", "empty": b""},
        job=GOLDEN_JOB,
        dead_at=1735689700000,
    )
    assert (letter.job_id, letter.job_type) == (GOLDEN_JOB.id, GOLDEN_JOB.type)
    back = codec.decode(codec.encode(letter))
    assert back == letter
    assert back.reason == "max_attempts"


def test_dead_letter_round_trip_of_undecodable_bytes(store: SchemaStore) -> None:
    codec = DeadLetterCodec(store)
    letter = DeadLetter(
        reason="some_future_reason",  # an open set: unknown reasons pass through
        message="not Avro single-object encoding",
        source_topic="pipeline.jobs.default",
        source_partition=0,
        source_offset=7,
        raw_value=b"\x00garbage",
    )
    assert codec.decode(codec.encode(letter)) == letter


def test_dead_letter_with_undecodable_job_is_a_decode_error(store: SchemaStore) -> None:
    codec = DeadLetterCodec(store)
    record = codec.to_record(
        DeadLetter(reason="x", message="m", source_topic="t", source_partition=0, source_offset=0)
    )
    data = store.encode({**record, "job": b"\xc3\x01nonsense"}, codec.schema)
    with pytest.raises(DecodeError, match=r"invalid pipeline\.DeadLetter") as info:
        codec.decode(data)
    assert info.value.raw == data


def test_event_round_trip(store: SchemaStore) -> None:
    codec = EventCodec(store)
    event = Event(
        job_id="j1",
        job_type="email.send",
        kind=EventKind.SUCCEEDED,
        attempt=1,
        priority="low",
        at=1735689600000,
        worker="host-1/42",
        duration_ms=12.5,
        progress=None,
        detail=None,
    )
    assert codec.decode(codec.encode(event)) == event


@pytest.mark.parametrize(
    ("duration_ms", "progress", "read"),
    [
        (float("nan"), float("nan"), (None, None)),
        (float("inf"), float("-inf"), (None, None)),
        (-1.0, 1.5, (-1.0, None)),
        (3.5, 0.25, (3.5, 0.25)),
        (0.0, 1.0, (0.0, 1.0)),
    ],
)
def test_an_event_s_figures_json_cannot_carry_are_read_as_unknown(
    store: SchemaStore, duration_ms: float, progress: float, read: tuple[float | None, ...]
) -> None:
    """Another producer's record (Avro doubles carry NaN and infinities): ``pipeline events
    --json`` printed ``NaN``, which no JSON reader accepts."""
    codec = EventCodec(store)
    event = Event(job_id="j1", job_type="t", kind=EventKind.PROGRESS, attempt=1,
                  priority="default", duration_ms=duration_ms, progress=progress)  # fmt: skip
    decoded = codec.decode(codec.encode(event))
    assert (decoded.duration_ms, decoded.progress) == read
    json.dumps(dataclasses.asdict(decoded), allow_nan=False)


def test_schedule_round_trip(store: SchemaStore) -> None:
    codec = ScheduleCodec(store)
    schedule = Schedule(
        name="nightly-report",
        cron="0 3 * * *",
        timezone="Europe/Paris",
        job_type="report.build",
        payload=b'{"kind":"daily"}',
        priority=Priority.LOW,
        max_attempts=3,
        missed="once",
        headers={"owner": "finance"},
        idempotency_ttl_s=86400.0,
        created_at=1735689600000,
        enabled=False,
    )
    assert codec.decode(codec.encode(schedule)) == schedule
    minimal = Schedule(name="n", cron="* * * * *", job_type="t", payload=b"{}", created_at=0)
    assert codec.decode(codec.encode(minimal)) == minimal


# -- job decoding failures ---------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64) | st.binary(max_size=64).map(lambda b: MARKER + b))
def test_random_bytes_are_decode_errors(codec: JobCodec, data: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        codec.decode(data)
    assert info.value.raw == data


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=200))
def test_random_bodies_after_a_valid_header_are_decode_errors_or_jobs(
    codec: JobCodec, body: bytes
) -> None:
    data = codec.schema.header + body
    outcome: Job | DecodeError
    try:
        outcome = codec.decode(data)
    except DecodeError as exc:
        outcome = exc
    if isinstance(outcome, DecodeError):
        assert outcome.raw == data
    else:
        assert isinstance(outcome, Job)


@pytest.mark.parametrize(
    ("data", "error", "reason"),
    [
        (b"", DecodeError, "empty message"),
        (b"\xc3\x00" + bytes.fromhex(GOLDEN_JOB_HEX)[2:], DecodeError, "starts with c3 00"),
        (MARKER + b"\xff" * 8 + b"\x00", SchemaNotFoundError, "ffffffffffffffff"),
    ],
)
def test_job_framing_errors(
    codec: JobCodec, data: bytes, error: type[DecodeError], reason: str
) -> None:
    with pytest.raises(error) as info:
        codec.decode(data)
    assert reason in str(info.value)
    assert info.value.raw == data


def test_every_cut_of_a_job_is_a_decode_error(codec: JobCodec) -> None:
    data = bytes.fromhex(GOLDEN_JOB_HEX)
    for cut in range(len(data)):
        with pytest.raises(DecodeError) as info:
            codec.decode(data[:cut])
        assert info.value.raw == data[:cut], cut


def test_a_cut_inside_a_number_is_named_truncated(codec: JobCodec) -> None:
    data = bytes.fromhex(GOLDEN_JOB_HEX)[:HEADER_SIZE]  # the header, then no body at all
    with pytest.raises(DecodeError, match="truncated: the body ends inside a field"):
        codec.decode(data)


@pytest.mark.parametrize(("attempt", "max_attempts"), [(0, 5), (-1, 5), (1, 0), (2, -3)])
def test_an_attempt_or_a_limit_below_one_is_a_decode_error(
    codec: JobCodec, store: SchemaStore, attempt: int, max_attempts: int
) -> None:
    record = {**codec.to_record(GOLDEN_JOB), "attempt": attempt, "max_attempts": max_attempts}
    data = store.encode(record, codec.schema)
    with pytest.raises(DecodeError, match="attempt and max_attempts must be at least 1") as info:
        codec.decode(data)
    assert f"attempt {attempt} and max_attempts {max_attempts}" in str(info.value)
    assert info.value.raw == data


def test_unknown_priority_is_a_decode_error(codec: JobCodec, store: SchemaStore) -> None:
    record = {**codec.to_record(GOLDEN_JOB), "priority": "urgent"}
    data = store.encode(record, codec.schema)
    with pytest.raises(DecodeError, match="unknown priority 'urgent'") as info:
        codec.decode(data)
    assert info.value.raw == data


def test_another_record_is_not_a_job(codec: JobCodec, store: SchemaStore) -> None:
    event = Event(job_id="j", job_type="t", kind="started", attempt=1, priority="high")
    data = EventCodec(store).encode(event)
    with pytest.raises(DecodeError, match=r"expected a pipeline\.Job"):
        codec.decode(data)


# -- JSON payloads -----------------------------------------------------------------------------


def test_payload_codecs_satisfy_the_protocol() -> None:
    codecs: list[PayloadCodec] = [JsonPayload(), AvroPayload(EMAIL_V1)]
    assert [c.encoding for c in codecs] == [PayloadEncoding.JSON, PayloadEncoding.AVRO]


def test_json_accepts_any_mapping() -> None:
    data = JsonPayload().encode("t", MappingProxyType({"a": 1}))
    assert data == b'{"a":1}'


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"when": datetime(2025, 1, 1, tzinfo=UTC)}, "field 'when'"),
        ({"order": {"lines": [1, Decimal("2.5")]}}, r"field 'order\.lines\[1\]'"),
        ({"ratio": float("nan")}, "field 'ratio'"),
        ({1: "x"}, "key 1 is not a string"),
        ({"nested": {("a", "b"): 1}}, r"field 'nested' has a key \('a', 'b'\)"),
        ({"bad": "\ud800"}, "field 'bad'"),
    ],
)
def test_json_validation_names_the_field(payload: Any, message: str) -> None:
    with pytest.raises(PayloadValidationError, match=message) as info:
        JsonPayload().encode("email.send", payload)
    assert info.value.job_type == "email.send"


def test_json_payload_must_be_a_mapping() -> None:
    with pytest.raises(PayloadValidationError, match="must be a mapping"):
        JsonPayload().encode("t", ["a"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("data", "reason"),
    [(b"[1,2]", "must be a JSON object, got list"), (b"{", "not UTF-8 JSON"), (b"\xff", "UTF-8")],
)
def test_json_decode_errors(data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason) as info:
        JsonPayload().decode("t", data)
    assert info.value.raw == data


@pytest.mark.parametrize(
    "data", [b'{"a":[1,"\xc3\xa9"]}', b' {"a":[1,"\xc3\xa9"]}', b'{"a":[1,"\xc3\xa9"]}\n\t ']
)
def test_json_decode_takes_what_json_loads_takes(data: bytes) -> None:
    assert JsonPayload().decode("t", data) == {"a": [1, "é"]}


@pytest.mark.parametrize("data", [b'{"a":1} {"b":2}', b'{"a":1}x', b" ", b""])
def test_json_decode_refuses_what_json_loads_refuses(data: bytes) -> None:
    with pytest.raises(DecodeError, match="not UTF-8 JSON"):
        JsonPayload().decode("t", data)


# -- Avro payloads -----------------------------------------------------------------------------


def test_avro_payload_schema_sources(tmp_path: Path) -> None:
    path = tmp_path / "email.v1.avsc"
    path.write_text(json.dumps(EMAIL_V1), encoding="utf-8")
    fingerprints = {
        AvroPayload(source).schema.fingerprint for source in (EMAIL_V1, json.dumps(EMAIL_V1), path)
    }
    assert len(fingerprints) == 1


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"to": 5}, r"EmailPayload\.to is <5>"),
        ({"to": "a", "retries": 1.5}, r"EmailPayload\.retries is <1\.5>"),
        ({"to": "a", "retries": 2**40}, r"EmailPayload\.retries"),
        ({"to": "a", "cc": 3}, r"EmailPayload\.cc"),
        ({"to": "a", "bcc": "x"}, "unknown field.*'bcc'"),
        ({"retries": 1}, "missing field.*'to'"),
    ],
)
def test_avro_validation_names_the_field(payload: Mapping[str, Any], message: str) -> None:
    with pytest.raises(PayloadValidationError, match=message) as info:
        AvroPayload(EMAIL_V1).encode("email.send", payload)
    assert info.value.job_type == "email.send"


def test_avro_payload_keeps_logical_types() -> None:
    schema = {
        "type": "record",
        "name": "Remind",
        "fields": [{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    codec = AvroPayload(schema)
    when = datetime(2025, 1, 1, 12, tzinfo=UTC)
    assert codec.decode("remind", codec.encode("remind", {"at": when})) == {"at": when}


def test_avro_payload_bytes_default() -> None:
    schema = {
        "type": "record",
        "name": "Blob",
        "fields": [{"name": "data", "type": "bytes", "default": "\u00ff"}],
    }
    codec = AvroPayload(schema)
    assert codec.decode("blob", codec.encode("blob", {})) == {"data": b"\xff"}


def test_avro_payload_decode_errors() -> None:
    codec = AvroPayload(EMAIL_V1)
    with pytest.raises(SchemaNotFoundError):
        codec.decode("email.send", MARKER + bytes(8) + b"\x02a")
    with pytest.raises(DecodeError, match=r"starts with 7b 22.*looks like JSON"):
        codec.decode("email.send", b'{"to":"a"}')
