"""The schema registry mode against a real registry (Apicurio) and a real Kafka.

A Java producer writes jobs with the registry's own Avro serializer, the whole envelope in one
case and the payload only in the other; a Python worker must run each once with its exact
payload. The Python side writes both forms too, the registry refuses an incompatible payload
schema with an error that names the subject, and a message whose schema id the registry does
not know is dead-lettered with that id.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer

from pipeline import ConfigurationError, Job, JobContext, Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline._deadletters import read_dead_letters
from pipeline._records import DeadLetterReason
from pipeline.schemaregistry import RegistryAvroPayload, SchemaRegistry
from tests.waiting import wait_for

from ..worker.harness import WorkerLauncher
from .common import INVOICE_SCHEMA, RECORD_ENV

if TYPE_CHECKING:
    from .apicurio import RunningRegistry

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[3]
JOB_SCHEMA = REPO / "schemas" / "pipeline" / "job.v1.avsc"
APP = "tests.integration.registry.app:app"
JOBS_PER_KIND = 25
DEADLINE_S = 90.0


@pytest.fixture
def registry_settings(settings: Settings, schema_registry: RunningRegistry) -> Settings:
    configured = settings.model_copy(
        update={
            "topics": settings.topics.model_copy(update={"partitions": 2}),
            "schema_registry": settings.schema_registry.model_copy(
                update={"url": schema_registry.ccompat_url}
            ),
        }
    )
    apply_topics(configured)
    return configured


@pytest.fixture
def worker(registry_settings: Settings, schema_registry: RunningRegistry, tmp_path: Path) -> Any:
    record = tmp_path / "runs.jsonl"
    launcher = WorkerLauncher(
        registry_settings,
        record,
        tmp_path,
        app=APP,
        env={"PIPELINE_SCHEMA_REGISTRY__URL": schema_registry.ccompat_url, RECORD_ENV: str(record)},
    )
    launcher.start()
    try:
        yield record
    finally:
        launcher.stop_all()


def _runs(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]


def _wait_for_runs(record: Path, expected: dict[str, tuple[str, dict[str, Any]]]) -> None:
    wait_for(lambda: {run["id"] for run in _runs(record)} >= set(expected), DEADLINE_S)
    runs = _runs(record)
    ids = [run["id"] for run in runs]
    assert sorted(set(ids)) == sorted(expected), f"ran {len(set(ids))} of {len(expected)} jobs"
    assert len(ids) == len(set(ids)), "a job ran twice"
    for run in runs:
        assert (run["type"], run["payload"]) == expected[run["id"]], run


def _produce(command: list[str], settings: Settings, registry_url: str) -> dict[str, Any]:
    """Runs a producer; what it printed: job id -> (type, the payload its handler must get)."""
    produced = subprocess.run(
        [
            *command,
            settings.bootstrap_servers,
            registry_url,
            settings.namespace,
            str(JOB_SCHEMA),
            str(INVOICE_SCHEMA),
            str(JOBS_PER_KIND),
        ],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert produced.returncode == 0, produced.stderr.decode(errors="replace")[-3000:]
    expected: dict[str, tuple[str, dict[str, Any]]] = {}
    for line in produced.stdout.decode("utf-8").splitlines():
        job_type, job_id, payload = line.split(" ", 2)
        expected[job_id] = (job_type, json.loads(payload))
    assert len(expected) == 2 * JOBS_PER_KIND
    return expected


def _subjects(schema_registry: RunningRegistry) -> list[str]:
    with SchemaRegistry(schema_registry.ccompat_url) as registry:
        return list(registry.client.get_subjects())


@pytest.mark.slow
def test_jobs_from_a_java_producer_using_the_registrys_serializer_run_once(
    registry_settings: Settings,
    schema_registry: RunningRegistry,
    java_registry_producer: list[str],
    worker: Path,
) -> None:
    expected = _produce(java_registry_producer, registry_settings, schema_registry.native_url)
    # The registry holds what the Java serializer registered: the envelope under the topic's
    # subject, the payload under the record's.
    subjects = _subjects(schema_registry)
    assert f"{registry_settings.namespace}.jobs.default-value" in subjects
    assert "acme.Invoice-value" in subjects
    _wait_for_runs(worker, expected)


@pytest.mark.slow
def test_jobs_from_a_go_producer_using_franz_gos_registry_serde_run_once(
    registry_settings: Settings,
    schema_registry: RunningRegistry,
    go_registry_producer: list[str],
    worker: Path,
) -> None:
    expected = _produce(go_registry_producer, registry_settings, schema_registry.ccompat_url)
    assert f"{registry_settings.namespace}.jobs.default-value" in _subjects(schema_registry)
    _wait_for_runs(worker, expected)


def test_python_writes_both_forms_and_the_worker_reads_them(
    registry_settings: Settings, schema_registry: RunningRegistry, worker: Path
) -> None:
    settings = registry_settings.model_copy(
        update={
            "schema_registry": registry_settings.schema_registry.model_copy(
                update={"envelope": True}
            )
        }
    )
    producer = Pipeline(settings)
    registry = SchemaRegistry(schema_registry.ccompat_url)
    payload = RegistryAvroPayload(INVOICE_SCHEMA, registry=registry)

    @producer.job("registry.invoice", payload=payload)
    def invoice(number: str, total_cents: int, note: str, ctx: JobContext) -> None:
        raise AssertionError("the worker runs it")

    @producer.job("registry.envelope")
    def envelope(greeting: str, n: int, ctx: JobContext) -> None:
        raise AssertionError("the worker runs it")

    expected: dict[str, tuple[str, dict[str, Any]]] = {}
    try:
        for i in range(JOBS_PER_KIND):
            fields: dict[str, Any] = {"number": f"PY-{i}", "total_cents": i, "note": "Grüße 🚀"}
            expected[invoice.enqueue(**fields)] = ("registry.invoice", fields)
            greeting: dict[str, Any] = {"greeting": "世界", "n": i}
            expected[envelope.enqueue(**greeting)] = ("registry.envelope", greeting)
        producer.flush(30)
        # What went out: envelopes and payloads framed as the registry's wire format.
        job = Job(id=uuid.uuid4().hex, type="registry.envelope", payload=b"{}")
        assert producer.codec.encode(job)[:1] == b"\x00"
        assert payload.encode("registry.invoice", {"number": "x", "total_cents": 1})[:1] == b"\x00"
    finally:
        producer.close(30)
        registry.close()
    _wait_for_runs(worker, expected)


def test_the_registry_refuses_an_incompatible_payload_schema(
    schema_registry: RunningRegistry,
) -> None:
    with SchemaRegistry(schema_registry.ccompat_url) as registry:
        _refuses_incompatible(registry, f"acme.Invoice-{uuid.uuid4().hex[:8]}-value")


def _refuses_incompatible(registry: SchemaRegistry, subject: str) -> None:
    registry.client.set_compatibility(subject, "BACKWARD")
    first = RegistryAvroPayload(INVOICE_SCHEMA, registry=registry, subject=subject)
    assert first.encode("registry.invoice", {"number": "1", "total_cents": 5})[:1] == b"\x00"

    schema = json.loads(INVOICE_SCHEMA.read_text())
    schema["fields"][1] = {"name": "total_cents", "type": "string"}  # long -> string: breaks
    assert not registry.compatible(subject, schema)
    changed = RegistryAvroPayload(schema, registry=registry, subject=subject)
    with pytest.raises(ConfigurationError, match=subject):
        changed.encode("registry.invoice", {"number": "1", "total_cents": "5"})

    schema["fields"][1] = {"name": "total_cents", "type": "long"}
    schema["fields"].append({"name": "currency", "type": "string", "default": "EUR"})
    assert registry.compatible(subject, schema)
    evolved = RegistryAvroPayload(schema, registry=registry, subject=subject)
    assert evolved.schema_id != first.schema_id
    # A payload written with the new version reads into the old one by Avro's rules.
    data = evolved.encode("registry.invoice", {"number": "2", "total_cents": 7})
    assert first.decode("registry.invoice", data) == {"number": "2", "total_cents": 7, "note": ""}


def test_an_unknown_schema_id_is_dead_lettered_with_the_id(
    registry_settings: Settings, worker: Path
) -> None:
    unknown_id = 987_654
    value = b"\x00" + unknown_id.to_bytes(4, "big") + b"\x02ab"
    producer = Producer({"bootstrap.servers": registry_settings.bootstrap_servers})
    producer.produce(f"{registry_settings.namespace}.jobs.default", value=value, key=b"k")
    assert producer.flush(30) == 0

    def dead() -> list[Any]:
        return [s.letter for s in read_dead_letters(registry_settings).letters]

    assert wait_for(lambda: len(dead()) == 1, DEADLINE_S), "no dead letter"
    (letter,) = dead()
    assert letter.reason == DeadLetterReason.DECODE_ERROR
    assert str(unknown_id) in letter.message
    assert letter.raw_value == value
