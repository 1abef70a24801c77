"""Schema evolution: readers resolve any known writer version by fingerprint (schemas/README.md)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline._avro import SchemaStore
from pipeline._codec import AvroPayload, DeadLetterCodec, JobCodec
from pipeline._errors import SchemaNotFoundError
from pipeline._job import Job, PayloadEncoding, Priority
from pipeline._records import DeadLetter

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
JOB_V1: dict[str, Any] = json.loads((SCHEMAS / "pipeline" / "job.v1.avsc").read_text("utf-8"))


def job_v2() -> dict[str, Any]:
    """A compatible next version: one new optional field, one new enum symbol."""
    schema = copy.deepcopy(JOB_V1)
    schema["fields"].append(
        {
            "name": "deadline",
            "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}],
            "default": None,
            "doc": "Do not run after this time.",
        }
    )
    encoding = next(f for f in schema["fields"] if f["name"] == "payload_encoding")
    encoding["type"]["symbols"].append("MSGPACK")
    return schema


@pytest.fixture
def evolved(tmp_path: Path) -> SchemaStore:
    """A schemas/ tree that has both versions of pipeline.Job."""
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "job.v1.avsc").write_text(json.dumps(JOB_V1), encoding="utf-8")
    (tmp_path / "pipeline" / "job.v2.avsc").write_text(json.dumps(job_v2()), encoding="utf-8")
    return SchemaStore(tmp_path)


JOB = Job(
    id="j-1",
    type="email.send",
    payload=b'{"to":"ada@example.com"}',
    priority=Priority.LOW,
    created_at=1735689600000,
    headers={"traceparent": "00-ab-cd-01"},
)


def test_v2_reader_reads_v1_bytes(evolved: SchemaStore) -> None:
    v1_bytes = JobCodec(SchemaStore()).encode(JOB)
    assert evolved.latest("pipeline.Job").version == 2
    record = evolved.decode(v1_bytes, "pipeline.Job")
    assert record["deadline"] is None  # the reader's default fills the new field
    assert record["id"] == "j-1"
    assert JobCodec(evolved).decode(v1_bytes) == JOB


def test_v1_reader_reads_v2_bytes_by_fingerprint(evolved: SchemaStore) -> None:
    v2 = evolved.latest("pipeline.Job")
    v1 = evolved.versions("pipeline.Job")[0]
    record = {**JobCodec(evolved).to_record(JOB), "deadline": 1735693200000}
    v2_bytes = evolved.encode(record, v2)
    assert v2_bytes[:10] == v2.header != v1.header

    as_v1 = evolved.decode(v2_bytes, v1)
    assert "deadline" not in as_v1  # a field the reader does not know is skipped
    assert as_v1 == JobCodec(evolved).to_record(JOB)


def test_a_reader_without_the_writer_schema_says_so(evolved: SchemaStore) -> None:
    """Deploy readers (with the new .avsc) before writers: the reverse is a clear error."""
    v2_bytes = JobCodec(evolved).encode(JOB)  # the codec writes the latest version, v2
    with pytest.raises(SchemaNotFoundError, match=evolved.latest("pipeline.Job").fingerprint_hex):
        JobCodec(SchemaStore()).decode(v2_bytes)


def test_an_unknown_enum_symbol_reads_as_the_enum_default(evolved: SchemaStore) -> None:
    record = {**JobCodec(evolved).to_record(JOB), "payload_encoding": "MSGPACK"}
    v2_bytes = evolved.encode(record, "pipeline.Job")
    as_v1 = evolved.decode(v2_bytes, evolved.versions("pipeline.Job")[0])
    assert as_v1["payload_encoding"] == "JSON"


def test_a_doc_only_change_keeps_the_fingerprint() -> None:
    store = SchemaStore.empty()
    first = store.register(JOB_V1, version=1)
    redoc = copy.deepcopy(JOB_V1)
    redoc["doc"] = "Reworded."
    second = store.register(redoc, version=2)
    assert first.fingerprint == second.fingerprint
    assert store.latest("pipeline.Job") is second
    assert store.by_fingerprint(first.fingerprint) is first


EMAIL_V1: dict[str, Any] = {
    "type": "record",
    "name": "EmailPayload",
    "namespace": "acme.email",
    "fields": [{"name": "to", "type": "string"}, {"name": "subject", "type": "string"}],
}
EMAIL_V2: dict[str, Any] = {
    **EMAIL_V1,
    "fields": [
        *EMAIL_V1["fields"],
        {"name": "cc", "type": {"type": "array", "items": "string"}, "default": []},
    ],
}


def test_newer_payload_reader_reads_older_payloads() -> None:
    old_bytes = AvroPayload(EMAIL_V1).encode("email.send", {"to": "a@b.c", "subject": "hi"})
    reader = AvroPayload(EMAIL_V2, other_versions=[EMAIL_V1])
    assert reader.decode("email.send", old_bytes) == {"to": "a@b.c", "subject": "hi", "cc": []}


def test_older_payload_reader_reads_newer_payloads_it_was_told_about() -> None:
    payload = {"to": "a@b.c", "subject": "hi", "cc": ["d@e.f"]}
    new_bytes = AvroPayload(EMAIL_V2).encode("email.send", payload)
    with pytest.raises(SchemaNotFoundError):
        AvroPayload(EMAIL_V1).decode("email.send", new_bytes)
    reader = AvroPayload(EMAIL_V1, other_versions=[EMAIL_V2])
    assert reader.decode("email.send", new_bytes) == {"to": "a@b.c", "subject": "hi"}


def test_a_payload_version_changing_only_defaults_and_logical_types_is_the_current_one() -> None:
    """v2 gives ``note`` a default and ``sent_at`` a logical type: the Parsing Canonical Form,
    hence the fingerprint, is v1's, yet v2 is what the codec writes and reads as."""
    v1: dict[str, Any] = {
        "type": "record",
        "name": "Reminder",
        "namespace": "acme",
        "fields": [
            {"name": "number", "type": "string"},
            {"name": "note", "type": "string"},
            {"name": "sent_at", "type": "long"},
        ],
    }
    v2 = copy.deepcopy(v1)
    v2["fields"][1]["default"] = ""
    v2["fields"][2]["type"] = {"type": "long", "logicalType": "timestamp-millis"}
    sent_at = datetime(2025, 1, 1, tzinfo=UTC)
    payload = AvroPayload(v2, other_versions=[v1])
    assert payload.schema.version == 2
    data = payload.encode("remind", {"number": "7", "sent_at": sent_at})
    assert payload.decode("remind", data) == {"number": "7", "note": "", "sent_at": sent_at}
    old = AvroPayload(v1).encode("remind", {"number": "8", "note": "n", "sent_at": 1735689600000})
    assert old[:10] == data[:10]
    assert payload.decode("remind", old) == {"number": "8", "note": "n", "sent_at": sent_at}


def test_payload_encoding_of_the_envelope_is_unchanged_by_payload_versions() -> None:
    assert AvroPayload(EMAIL_V2, other_versions=[EMAIL_V1]).encoding is PayloadEncoding.AVRO


def test_a_dead_letter_written_as_version_1_still_decodes_without_a_traceback() -> None:
    store = SchemaStore()
    v1, v2 = store.versions("pipeline.DeadLetter")
    assert store.latest("pipeline.DeadLetter") is v2
    codec = DeadLetterCodec(store)
    letter = DeadLetter(
        reason="max_attempts",
        message="smtp timed out",
        source_topic="pipeline.jobs.default",
        source_partition=1,
        source_offset=9,
        job=JOB,
        dead_at=1735689700000,
        traceback="Traceback (most recent call last):\n  ...\nTimeoutError: smtp timed out\n",
    )
    record = codec.to_record(letter)
    del record["traceback"]
    v1_bytes = store.encode(record, v1)
    assert v1_bytes[:10] == v1.header
    old = codec.decode(v1_bytes)
    assert old.traceback is None
    assert old.job == JOB
    new = codec.decode(codec.encode(letter))
    assert codec.encode(letter)[:10] == v2.header
    assert new == letter
