"""The schema registry mode without a registry: framing, caching, errors and waiting it out.

A fake stands in for confluent-kafka's client (the real registry is in
``tests/integration/registry``): it serves schemas by id, counts lookups, and can fail.
"""

from __future__ import annotations

import copy
import io
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError
from pydantic import ValidationError

from pipeline import ConfigurationError, DecodeError, Job, Pipeline, SchemaNotFoundError
from pipeline._codec import JobCodec
from pipeline._envelopes import INT_FIELDS, service_codec
from pipeline._schemaregistry import frame
from pipeline._settings import Settings
from pipeline.schemaregistry import (
    EnvelopeFraming,
    RegistryAvroPayload,
    SchemaRegistry,
    SchemaRegistryUnavailableError,
    job_codec,
)
from pipeline.testing import InMemoryTransport

ROOT = Path(__file__).resolve().parents[2]
INVOICE = {
    "type": "record",
    "name": "Invoice",
    "namespace": "acme",
    "fields": [
        {"name": "number", "type": "string"},
        {"name": "note", "type": "string", "default": ""},
    ],
}


@dataclass
class _Schema:
    schema_str: str
    schema_type: str = "AVRO"


@dataclass
class FakeClient:
    """Subjects and ids in memory; ``failures`` are raised, in order, before any answer."""

    schemas: dict[int, str] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)
    failures: list[Exception] = field(default_factory=list)
    lookups: int = 0

    def _maybe_fail(self) -> None:
        if self.failures:
            raise self.failures.pop(0)

    def register_schema(self, subject: str, schema: Any) -> int:
        self._maybe_fail()
        known = {text: schema_id for schema_id, text in self.schemas.items()}
        schema_id = known.get(schema.schema_str, len(self.schemas) + 1)
        self.schemas[schema_id] = schema.schema_str
        self.subjects.setdefault(subject, []).append(schema_id)
        return schema_id

    def get_schema(self, schema_id: int) -> _Schema:
        self.lookups += 1
        self._maybe_fail()
        if schema_id not in self.schemas:
            raise SchemaRegistryError(404, 40403, "Schema not found")
        return _Schema(self.schemas[schema_id])

    def close(self) -> None:
        pass


def _registry(client: FakeClient, **kwargs: Any) -> tuple[SchemaRegistry, list[float]]:
    slept: list[float] = []
    registry = SchemaRegistry("http://registry.invalid", sleep=slept.append, **kwargs)
    registry.client = client  # type: ignore[assignment]
    return registry, slept


def test_a_payload_is_framed_with_the_registered_id_and_reads_back() -> None:
    client = FakeClient()
    registry, _ = _registry(client)
    payload = RegistryAvroPayload(INVOICE, registry=registry)
    data = payload.encode("invoice", {"number": "7"})
    assert client.subjects == {"acme.Invoice-value": [1]}
    assert data[:5] == b"\x00\x00\x00\x00\x01"
    assert payload.decode("invoice", data) == {"number": "7", "note": ""}
    assert payload.decode("invoice", data) == {"number": "7", "note": ""}
    assert client.lookups == 0, "the writer of an id it registered is the schema it sent"
    reading, _ = _registry(client)  # another process: it fetches the writer once per id
    reader = RegistryAvroPayload(INVOICE, registry=reading)
    assert reader.decode("invoice", data) == {"number": "7", "note": ""}
    assert reader.decode("invoice", data) == {"number": "7", "note": ""}
    assert client.lookups == 1
    # Single-object payloads (a producer without the registry) still read.
    plain = payload.store.encode({"number": "8", "note": "n"}, payload.schema)
    assert payload.decode("invoice", plain) == {"number": "8", "note": "n"}


def test_a_payload_of_a_newer_version_resolves_into_the_readers_schema() -> None:
    client = FakeClient()
    registry, _ = _registry(client)
    newer = {**INVOICE, "fields": [*INVOICE["fields"], {"name": "cents", "type": "long"}]}
    data = RegistryAvroPayload(newer, registry=registry).encode(
        "invoice", {"number": "1", "cents": 5}
    )
    reader = RegistryAvroPayload(INVOICE, registry=registry)
    assert reader.decode("invoice", data) == {"number": "1", "note": ""}


def test_an_unknown_id_is_a_schema_not_found_error_with_the_raw_bytes() -> None:
    registry, _ = _registry(FakeClient())
    payload = RegistryAvroPayload(INVOICE, registry=registry)
    data = b"\x00\x00\x00\x30\x39\x02a\x00"
    with pytest.raises(SchemaNotFoundError, match="schema id 12345") as caught:
        payload.decode("invoice", data)
    assert caught.value.raw == data


@pytest.mark.parametrize("data", [b"\x00\x00\x01", b"\x00"])
def test_a_truncated_frame_is_a_decode_error(data: bytes) -> None:
    registry, _ = _registry(FakeClient())
    with pytest.raises(DecodeError, match="4-byte schema id"):
        RegistryAvroPayload(INVOICE, registry=registry).decode("invoice", data)


def test_a_body_that_does_not_match_its_schema_is_a_decode_error() -> None:
    client = FakeClient()
    registry, _ = _registry(client)
    payload = RegistryAvroPayload(INVOICE, registry=registry)
    good = payload.encode("invoice", {"number": "7"})
    with pytest.raises(DecodeError, match="unexpected bytes"):
        payload.decode("invoice", good + b"\x00")


def test_a_reader_waits_out_an_unreachable_registry() -> None:
    client = FakeClient(schemas={1: json.dumps(INVOICE)})
    client.failures = [ConnectionError("refused"), SchemaRegistryError(503, 50301, "busy")] * 3
    registry, slept = _registry(client)
    payload = RegistryAvroPayload(INVOICE, registry=registry)
    assert payload.decode("invoice", b"\x00\x00\x00\x00\x01\x02a\x00") == {
        "number": "a",
        "note": "",
    }
    assert slept == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0], "backoff doubling up to 10 s"


def test_a_writer_gives_up_after_wait_s_with_a_clear_error() -> None:
    client = FakeClient(failures=[ConnectionError("refused")] * 100)
    registry, _ = _registry(client, wait_s=0.0)
    with pytest.raises(SchemaRegistryUnavailableError, match="did not answer"):
        RegistryAvroPayload(INVOICE, registry=registry).encode("invoice", {"number": "1"})


@pytest.mark.parametrize(
    ("failure", "says"),
    [
        (SchemaRegistryError(401, 40101, "unauthorized"), "check the credentials in schema_r"),
        (SchemaRegistryError(403, 40301, "forbidden"), "check the credentials in schema_r"),
        (SchemaRegistryError(404, -1, "HTTP 404 Not Found"), "is its path right?"),
        (SchemaRegistryError(400, 400, "bad request"), "nothing was sent"),
        (SchemaRegistryError(409, 409, "incompatible"), "compatibility rule"),
    ],
)
def test_a_client_error_at_enqueue_is_a_settings_error_saying_what_to_check(
    failure: SchemaRegistryError, says: str
) -> None:
    client = FakeClient(failures=[failure])
    registry, slept = _registry(client)
    with pytest.raises(ConfigurationError) as raised:
        RegistryAvroPayload(INVOICE, registry=registry).encode("invoice", {"number": "1"})
    assert slept == [], "a refusal is not retried"
    message = str(raised.value)
    assert f"(HTTP {failure.http_status_code})" in message
    assert failure.error_message in message
    assert says in message
    assert "refused 'Invoice' under subject 'acme.Invoice-value'" in message


@pytest.mark.parametrize("status", [429, 408])
def test_a_reader_waits_out_a_registry_that_says_not_now(status: int) -> None:
    """Too Many Requests and Request Timeout are the registry's "later", not a verdict on the
    message: the reader waits, rather than dead-letter a job it can read in a second."""
    client = FakeClient(schemas={1: json.dumps(INVOICE)})
    client.failures = [SchemaRegistryError(status, -1, "slow down")] * 2
    registry, slept = _registry(client)
    payload = RegistryAvroPayload(INVOICE, registry=registry)
    data = b"\x00\x00\x00\x00\x01\x02a\x00"
    assert payload.decode("invoice", data) == {"number": "a", "note": ""}
    assert slept == [0.5, 1.0]


@pytest.mark.parametrize("status", [401, 403])
def test_a_reader_waits_out_a_refusal_of_its_credentials(status: int) -> None:
    """A worker whose registry credentials are wrong (or not yet granted) waits, saying so,
    rather than dead-letter every job it reads meanwhile; a writer is told at once."""
    client = FakeClient(schemas={1: json.dumps(INVOICE)})
    client.failures = [SchemaRegistryError(status, 40101, "unauthorized")] * 2
    registry, slept = _registry(client)
    payload = RegistryAvroPayload(INVOICE, registry=registry)
    data = b"\x00\x00\x00\x00\x01\x02a\x00"
    assert payload.decode("invoice", data) == {"number": "a", "note": ""}
    assert slept == [0.5, 1.0]


def test_a_registry_that_never_answers_fails_an_enqueue_after_about_wait_s() -> None:
    """A registry that takes the connection and never answers (a hung process, a black-holed
    network) is given up on like one that refuses it: requests time out by default."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)  # the kernel accepts connections; nobody ever answers them
        host, port = hung.getsockname()
        slept: list[float] = []
        registry = SchemaRegistry(f"http://{host}:{port}", wait_s=0.2, sleep=slept.append)
        outcome: list[BaseException] = []

        def enqueue() -> None:
            try:
                RegistryAvroPayload(INVOICE, registry=registry).encode("invoice", {"number": "1"})
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=enqueue, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "the enqueue still waits for a registry that never answers"
    [error] = outcome
    assert isinstance(error, SchemaRegistryUnavailableError)
    assert "did not answer" in str(error)


def test_numeric_client_options_of_the_settings_reach_the_client() -> None:
    settings = Settings(
        schema_registry={
            "url": "http://registry.invalid",
            "client": {"timeout": 2.5, "max.retries": 2, "basic.auth.user.info": "u:p"},
        }
    )
    codec = job_codec(settings)
    assert isinstance(codec.framing, EnvelopeFraming)
    options = codec.framing.registry.options
    assert options["timeout"] == 2.5
    assert options["max.retries"] == 2
    assert options["basic.auth.user.info"] == "u:p"


def test_an_envelope_registered_with_logical_types_reads_times_as_milliseconds() -> None:
    """The Avro binary of a ``timestamp-millis`` is a plain long: a producer whose registered
    envelope schema carries one still gives jobs with int times (the scheduler compares them)."""
    schema = json.loads((ROOT / "schemas" / "pipeline" / "job.v1.avsc").read_text("utf-8"))
    annotated = copy.deepcopy(schema)
    for item in annotated["fields"]:
        if item["name"] == "created_at":
            item["type"] = {"type": "long", "logicalType": "timestamp-millis"}
        if item["name"] == "not_before":
            item["type"] = ["null", {"type": "long", "logicalType": "timestamp-millis"}]
    registry, _ = _registry(FakeClient(schemas={7: json.dumps(annotated)}))
    codec = JobCodec(framing=EnvelopeFraming(registry, "ns.jobs-value", writes=False))
    job = Job(id="j1", type="t", payload=b"{}", created_at=1735689600000, not_before=1735689601234)
    framed = b"\x00\x00\x00\x00\x07" + JobCodec().encode(job)[10:]
    assert codec.decode(framed) == job
    # A payload reader keeps the logical types its registered schema gives.
    assert registry.writer(7, logical_types=True) is not registry.writer(7, logical_types=False)


def test_a_writer_schema_the_reader_cannot_parse_is_a_decode_error_naming_the_id() -> None:
    """E.g. a schema with references to another subject: the message is dead-lettered with its
    bytes, as an unknown id is, instead of an error no reader expects."""
    referencing = {**INVOICE, "fields": [{"name": "number", "type": "acme.Number"}]}
    registry, _ = _registry(FakeClient(schemas={3: json.dumps(referencing)}))
    data = b"\x00\x00\x00\x00\x03\x02a\x00"
    with pytest.raises(DecodeError, match="schema id 3") as caught:
        RegistryAvroPayload(INVOICE, registry=registry).decode("invoice", data)
    assert caught.value.raw == data


def test_envelopes_round_trip_and_plain_ones_still_read() -> None:
    registry, _ = _registry(FakeClient())
    writing = JobCodec(framing=EnvelopeFraming(registry, "ns.jobs-value", writes=True))
    job = Job(id="j1", type="email.send", payload=b'{"to":"a"}', headers={"k": "v"})
    framed = writing.encode(job)
    assert framed[:1] == b"\x00"
    assert writing.decode(framed) == job
    assert writing.decode(JobCodec().encode(job)) == job
    reading = JobCodec(framing=EnvelopeFraming(registry, "ns.jobs-value", writes=False))
    assert reading.encode(job) == JobCodec().encode(job)
    assert reading.decode(framed) == job


def test_an_envelope_with_an_int_past_32_bits_is_a_decode_error() -> None:
    """fastavro reads such an int without a word: the job ran, then neither its retry nor its
    dead letter could be encoded (an Avro int), and its partition stood still behind it."""
    registry, _ = _registry(FakeClient())
    codec = JobCodec(framing=EnvelopeFraming(registry, "ns.jobs-value", writes=True))
    job = Job(id="j1", type="email.send", payload=b"{}")
    framed = codec.encode(job)
    record = codec.to_record(job)
    record["max_attempts"] = 2**40
    body = io.BytesIO()
    fastavro.schemaless_writer(body, codec.schema.parsed, record)  # writes what it is given
    with pytest.raises(DecodeError, match=r"max_attempts") as caught:
        codec.decode(framed[:5] + body.getvalue())
    assert caught.value.raw == framed[:5] + body.getvalue()


def _service_writing(client: FakeClient, **kwargs: Any) -> tuple[JobCodec, Job, list[float]]:
    """A service's codec over ``client``, its first write (single-object, at once) made, and
    its registration in the background over; the codec, the job written, the waits slept."""
    registry, slept = _registry(client, **kwargs)
    codec = service_codec(JobCodec(framing=EnvelopeFraming(registry, "ns.jobs-value", writes=True)))
    job = Job(id="j1", type="email.send", payload=b"{}")
    assert codec.encode(job) == JobCodec().encode(job)
    framing = codec.framing
    assert isinstance(framing, EnvelopeFraming)
    assert framing._registering is not None
    framing._registering.join(5)
    return codec, job, slept


def test_a_services_envelope_schema_refused_for_good_leaves_its_writes_single_object(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = FakeClient(failures=[SchemaRegistryError(409, 409, "incompatible")])
    codec, job, _ = _service_writing(client)
    assert "refused the job envelope's schema" in caplog.text
    assert codec.encode(job) == JobCodec().encode(job)  # single-object for good, never blocked


def test_the_int_fields_checked_are_those_of_the_envelope_s_schema() -> None:
    """The check names the fields rather than walking the record: a new int field of
    ``pipeline.Job`` must join it."""
    fields = {f["name"]: f["type"] for f in JobCodec().schema.schema["fields"]}
    assert sorted(name for name, kind in fields.items() if kind == "int") == sorted(INT_FIELDS)
    errors = fields["errors"]["items"]["fields"]
    assert [f["name"] for f in errors if f["type"] == "int"] == ["attempt"]


def test_a_lookup_the_registry_refuses_for_good_is_a_decode_error() -> None:
    """Neither waited out nor a missing id: a DecodeError, which every reader dead-letters (the
    scheduler and the retry relay stopped on the registry's own error)."""
    registry, _ = _registry(FakeClient())
    codec = JobCodec(framing=EnvelopeFraming(registry, "ns.jobs-value", writes=True))
    framed = codec.encode(Job(id="j1", type="email.send", payload=b"{}"))
    reading, slept = _registry(FakeClient(failures=[SchemaRegistryError(422, 42201, "bad")]))
    reader = JobCodec(framing=EnvelopeFraming(reading, "ns.jobs-value", writes=False))
    with pytest.raises(DecodeError, match=r"refused the lookup of schema id 1") as caught:
        reader.decode(framed)
    assert caught.value.raw == framed
    assert slept == []


def test_a_services_writes_never_wait_for_the_registry() -> None:
    """A worker's retries and dead letters, the scheduler's cron fires: written single-object
    (which every reader reads) until the envelope's schema is registered, on a thread of its
    own, again and again until the registry answers. They waited for it (on the worker's event
    loop), then failed: the scheduler stopped at every fire, the worker left the job's offset
    unfinished."""
    client = FakeClient(failures=[ConnectionError("refused")] * 3)
    codec, job, slept = _service_writing(client, wait_s=0.0)  # a producer's write would give up
    assert client.subjects == {"ns.jobs-value": [1]}
    assert slept == [0.5, 1.0, 2.0]
    framed = codec.encode(job)
    assert framed[:5] == b"\x00\x00\x00\x00\x01"
    assert codec.decode(framed) == job
    plain = JobCodec()
    assert service_codec(plain) is plain


def test_without_a_url_the_codec_has_no_framing_and_refuses_framed_envelopes() -> None:
    codec = job_codec(Settings())
    assert codec.framing is None
    with pytest.raises(DecodeError, match=r"schema_registry\.url"):
        codec.decode(b"\x00\x00\x00\x00\x01\x02")


def test_with_a_url_the_codec_reads_framed_envelopes() -> None:
    settings = Settings(namespace="acme", schema_registry={"url": "http://registry.invalid"})
    codec = job_codec(settings)
    assert isinstance(codec.framing, EnvelopeFraming)
    assert codec.framing.subject == "acme.jobs-value"
    assert not codec.framing.writes


@pytest.mark.parametrize(
    ("language", "project"),
    [("java", "tests/integration/registry/java"), ("go", "tests/interop/go/registry")],
)
def test_the_documents_code_is_the_tested_producers(language: str, project: str) -> None:
    """docs/schema-registry.md shows code of the producers the registry tests run, verbatim
    (a block may be indented less than in the file)."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "schema-registry.md").read_text(encoding="utf-8")
    sources = (root / project).rglob(f"*.{language}")
    code = "".join(path.read_text(encoding="utf-8") for path in sources)
    flat = "\n".join(line.strip() for line in code.splitlines())
    blocks = re.findall(rf"```{language}\n(.*?)```", doc, flags=re.DOTALL)
    assert blocks, f"the document has a {language} block"
    for block in blocks:
        lines = "\n".join(line.strip() for line in block.strip().splitlines())
        assert lines in flat, f"the doc's {language} differs from the test's:\n{block}"


def test_a_password_in_the_registry_url_is_in_no_message_log_or_repr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``https://user:secret@registry`` is how the registry client takes basic auth."""
    url = "http://ops:s3cr3t@registry.invalid"
    client = FakeClient(failures=[ConnectionError(f"cannot reach {url}")])
    registry = SchemaRegistry(url, sleep=lambda s: None)
    registry.client = client  # type: ignore[assignment]
    RegistryAvroPayload(INVOICE, registry=registry).encode("invoice", {"number": "1"})
    assert caplog.records, "the retry is logged"
    given_up = SchemaRegistry(url, wait_s=0.0)
    given_up.client = FakeClient(failures=[ConnectionError(f"cannot reach {url}")])  # type: ignore[assignment]
    with pytest.raises(SchemaRegistryUnavailableError) as raised:
        RegistryAvroPayload(INVOICE, registry=given_up).encode("invoice", {"number": "1"})
    shown = [str(raised.value), repr(registry), *(str(r.__dict__) for r in caplog.records)]
    assert not [text for text in shown if "s3cr3t" in text]
    assert "http://ops:**********@registry.invalid" in str(raised.value)


def test_an_enqueue_asks_the_registry_nothing_after_registering_its_schema() -> None:
    """The enqueue checks the payload as the handler gets it, reading the bytes just framed:
    that read asked the registry for the id just registered (confluent-kafka's client does not
    serve it from what it registered), with no time limit, and an enqueue whose lookup failed
    waited for good."""
    client = FakeClient()
    registry, _ = _registry(client, wait_s=0.5)
    app = Pipeline(transport=InMemoryTransport())

    @app.job("invoice.render", payload=RegistryAvroPayload(INVOICE, registry=registry))
    def render(number: str, note: str = "") -> None: ...

    client.failures = [ConnectionError("the registry went away")] * 1000
    client.register_schema = lambda subject, schema: 1  # type: ignore[method-assign]
    client.schemas[1] = json.dumps(INVOICE)
    assert app.enqueue("invoice.render", {"number": "1"})
    assert client.lookups == 0


LONG_DUE = {
    "type": "record",
    "name": "Invoice",
    "namespace": "acme",
    "fields": [{"name": "due", "type": "long"}],
}
TIMESTAMP_DUE = {
    **LONG_DUE,
    "fields": [{"name": "due", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
}
DUE = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("writer", "reader", "written", "read"),
    [
        (TIMESTAMP_DUE, LONG_DUE, DUE, 1_735_689_600_000),  # a Java producer's generated class
        (LONG_DUE, TIMESTAMP_DUE, 1_735_689_600_000, DUE),
    ],
)
def test_a_framed_payload_reads_with_the_handler_s_logical_types(
    writer: dict[str, Any], reader: dict[str, Any], written: Any, read: Any
) -> None:
    """The same binary (the canonical forms are equal): the handler gets its own types, as a
    single-object payload gives them, not those of the producer's schema."""
    client = FakeClient(schemas={5: json.dumps(writer)})
    registry, _ = _registry(client)
    body = io.BytesIO()
    fastavro.schemaless_writer(body, fastavro.parse_schema(writer), {"due": written})
    payload = RegistryAvroPayload(reader, registry=registry)
    assert payload.decode("invoice", frame(5, body.getvalue())) == {"due": read}


def test_a_registry_url_without_its_scheme_is_refused_without_showing_it() -> None:
    # The client refused it with a traceback that printed the URL, password included.
    for url in ("alice:s3cret@registry:8081", "http://a:8081,alice:s3cret@b:8081"):
        with pytest.raises(ValidationError, match="must start with http:// or https://") as bad:
            Settings(schema_registry={"url": url})
        assert "s3cret" not in str(bad.value)
        with pytest.raises(ConfigurationError, match="must start with http") as refused:
            SchemaRegistry(url)
        assert "s3cret" not in str(refused.value)


def test_client_options_from_the_environment_are_numbers_and_a_wrong_one_is_named() -> None:
    settings = Settings(
        schema_registry={"url": "http://r.invalid", "client": {"timeout": "5", "max.retries": "2"}}
    )
    assert settings.schema_registry.client == {"timeout": 5, "max.retries": 2}
    codec = job_codec(settings)
    assert isinstance(codec.framing, EnvelopeFraming)
    assert codec.framing.registry.options["timeout"] == 5
    with pytest.raises(ConfigurationError, match="refused its options: Unrecognized properties"):
        SchemaRegistry("http://r.invalid", client={"timout": 5})


def test_a_404_that_is_not_the_registry_s_answer_is_waited_out_not_a_missing_schema() -> None:
    """A wrong path (Apicurio without /apis/ccompat/v7) answers 404 without the registry's
    error code: every framed job was dead-lettered as of a schema "not in the registry"."""
    client = FakeClient()
    writing, _ = _registry(client)
    data = RegistryAvroPayload(INVOICE, registry=writing).encode("invoice", {"number": "7"})
    reading, slept = _registry(client)
    client.failures = [SchemaRegistryError(404, -1, "Not Found")] * 2
    reader = RegistryAvroPayload(INVOICE, registry=reading)
    assert reader.decode("invoice", data) == {"number": "7", "note": ""}
    assert len(slept) == 2
