"""The wire contract against a real Kafka, with clients that are not this library.

A job built with plain fastavro from ``schemas/pipeline/job.v1.avsc`` alone, following
docs/wire-format.md, and produced with kcat must decode with :class:`JobCodec`; a job encoded by
:class:`JobCodec` and produced with confluent-kafka must be read back by kcat and decoded with
plain fastavro the way the document tells a non-Python consumer to.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fastavro
import fastavro.schema
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]

from pipeline._codec import JobCodec
from pipeline._job import AttemptError, Job, PayloadEncoding, Priority

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.kafka

JOB_SCHEMA_FILE = Path(__file__).resolve().parents[2] / "schemas" / "pipeline" / "job.v1.avsc"
DEADLINE_S = 60.0


def _by_the_document() -> tuple[dict[str, Any], bytes]:
    """What docs/wire-format.md tells a producer to do, with fastavro and the .avsc file only."""
    schema = json.loads(JOB_SCHEMA_FILE.read_text(encoding="utf-8"))
    canonical = fastavro.schema.to_parsing_canonical_form(schema)
    fingerprint = bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))
    return schema, b"\xc3\x01" + fingerprint


@pytest.fixture
def topic(bootstrap_servers: str, namespace: str) -> Iterator[str]:
    name = f"{namespace}.jobs.high"
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    futures[name].result(timeout=DEADLINE_S)
    yield name
    admin.delete_topics([name], operation_timeout=DEADLINE_S)[name].result(timeout=DEADLINE_S)


def _consume_one(bootstrap_servers: str, topic: str) -> tuple[bytes | None, bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap_servers,
            "group.id": f"wire-interop-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            value = message.value()
            assert isinstance(value, bytes)
            return message.key(), value
        raise AssertionError(f"no message on {topic} within {DEADLINE_S}s")
    finally:
        consumer.close()


def _ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _kcat(*args: str, stdin: bytes | None = None) -> bytes:
    result = subprocess.run(
        ["kcat", *args], input=stdin, capture_output=True, timeout=DEADLINE_S, check=False
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return result.stdout


def test_a_job_from_plain_fastavro_and_kcat_decodes_with_job_codec(
    bootstrap_servers: str, topic: str, tmp_path: Path
) -> None:
    schema, header = _by_the_document()
    created = _ms(datetime(2025, 1, 1, 12, 30, tzinfo=UTC))
    failed = _ms(datetime(2025, 1, 1, 12, 31, 5, 250000, tzinfo=UTC))
    record = {
        "id": "b7f3c1d2-java-style-id",
        "type": "email.send",
        "payload": json.dumps({"to": "ada@example.com"}, separators=(",", ":")).encode(),
        "payload_encoding": "JSON",
        "priority": "high",
        "attempt": 2,
        "max_attempts": 7,
        "created_at": created,  # milliseconds since the epoch
        "not_before": None,
        "idempotency_key": "welcome-ada",
        "tenant": "acme",
        "headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        "errors": [
            {
                "attempt": 1,
                "at": failed,
                "error_class": "smtplib.SMTPServerDisconnected",
                "message": "Connection unexpectedly closed\n(line two)",
                "retryable": True,
                "traceback_digest": "9f2c",
                "worker": None,
            }
        ],
    }
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(schema), record)
    value_file = tmp_path / "job.bin"
    value_file.write_bytes(header + body.getvalue())
    # A file argument is sent as one message, byte for byte (no delimiter splitting).
    _kcat("-P", "-b", bootstrap_servers, "-t", topic, "-k", "welcome-ada", str(value_file))

    key, value = _consume_one(bootstrap_servers, topic)
    assert key == b"welcome-ada"
    assert value == value_file.read_bytes()
    assert JobCodec().decode(value) == Job(
        id="b7f3c1d2-java-style-id",
        type="email.send",
        payload=b'{"to":"ada@example.com"}',
        payload_encoding=PayloadEncoding.JSON,
        priority=Priority.HIGH,
        attempt=2,
        max_attempts=7,
        created_at=created,
        not_before=None,
        idempotency_key="welcome-ada",
        tenant="acme",
        headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        errors=[
            AttemptError(
                attempt=1,
                at=failed,
                error_class="smtplib.SMTPServerDisconnected",
                message="Connection unexpectedly closed\n(line two)",
                retryable=True,
                traceback_digest="9f2c",
                worker=None,
            )
        ],
    )


def test_a_job_from_job_codec_reads_with_kcat_and_plain_fastavro(
    bootstrap_servers: str, topic: str
) -> None:
    job = Job(
        id="01941f297c00a1b2000000000000002a",
        type="report.build",
        payload=b'{"month":"2025-01","lines":["a\\nb"]}',
        priority=Priority.HIGH,
        created_at=1735689600000,
        not_before=1735693200000,
        headers={"source": "billing", "newline": "\n"},
    )
    producer = Producer(
        {"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "acks": "all"}
    )
    producer.produce(topic, JobCodec().encode(job), key=b"monthly-2025-01")
    assert producer.flush(DEADLINE_S) == 0

    # Key length, value length, then the raw bytes: binary-safe whatever the bytes are.
    out = _kcat(
        "-C", "-b", bootstrap_servers, "-t", topic, "-p", "0", "-o", "beginning", "-c", "1", "-e",
        "-f", "%K %S %k%s",
    )  # fmt: skip
    key_size, value_size, rest = out.split(b" ", 2)
    key, value = rest[: int(key_size)], rest[int(key_size) :]
    assert key == b"monthly-2025-01"
    assert len(value) == int(value_size)

    schema, header = _by_the_document()
    assert value[:10] == header
    buffer = io.BytesIO(value[10:])
    record = fastavro.schemaless_reader(buffer, fastavro.parse_schema(schema), None)
    assert buffer.tell() == len(value) - 10
    assert record == {
        "id": job.id,
        "type": "report.build",
        "payload": job.payload,
        "payload_encoding": "JSON",
        "priority": "high",
        "attempt": 1,
        "max_attempts": 5,
        "created_at": 1735689600000,
        "not_before": 1735693200000,
        "idempotency_key": None,
        "tenant": None,
        "headers": {"source": "billing", "newline": "\n"},
        "errors": [],
    }
