"""Payloads are checked against the handler's annotations, at enqueue and in the worker."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest

from pipeline import AvroPayload, JsonPayload, PayloadValidationError, Pipeline, Settings
from pipeline._schedule import make_schedule
from pipeline.testing import InMemoryTransport


@pytest.fixture
def transport() -> InMemoryTransport:
    return InMemoryTransport()


@pytest.fixture
def app(transport: InMemoryTransport) -> Pipeline:
    return Pipeline(Settings(namespace="acme"), transport=transport)


def test_a_wrong_type_is_refused_at_enqueue_with_each_field_named(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    @app.job("notify")
    def notify(user_id: int, message: str) -> None: ...

    with pytest.raises(PayloadValidationError) as raised:
        app.enqueue("notify", {"user_id": "not-an-int", "message": 7})
    assert raised.value.errors == (
        "user_id: Input should be a valid integer (got 'not-an-int')",
        "message: Input should be a valid string (got 7)",
    )
    assert "user_id: Input should be a valid integer" in str(raised.value)
    app.flush()
    assert transport.messages == [], "an invalid payload sends nothing"

    notify.enqueue(user_id=1, message="hi")
    app.flush()
    assert len(transport.messages) == 1


def test_strict_rules_read_values_as_json_carries_them(app: Pipeline) -> None:
    @app.job("typed")
    def typed(
        *, count: int, ratio: float, when: datetime, ref: UUID, price: Decimal, flag: bool = False
    ) -> None: ...

    ok = {
        "count": 1,
        "ratio": 2,  # an integer is a float
        "when": "2026-03-01T12:00:00Z",  # ISO 8601 string: JSON has no datetime
        "ref": "12345678-1234-5678-1234-567812345678",
        "price": "9.99",
    }
    app.enqueue("typed", ok)
    for field, value in [("count", "1"), ("count", 1.5), ("flag", 1), ("ratio", "2")]:
        with pytest.raises(PayloadValidationError, match=field):
            app.enqueue("typed", {**ok, field: value})


def test_the_worker_side_returns_validated_arguments(app: Pipeline) -> None:
    @app.job("at")
    def at(when: datetime, note: str = "", **rest: Any) -> None: ...

    job_type = app.registry.get("at")
    kwargs = job_type.load_payload(JsonPayload(), b'{"when": "2026-03-01T12:00:00Z", "x": [1]}')
    assert kwargs["when"] == datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert kwargs["x"] == [1], "**kwargs lets other fields through"
    with pytest.raises(PayloadValidationError, match=r"when: Input should be a valid datetime"):
        job_type.load_payload(JsonPayload(), b'{"when": "yesterday"}')
    with pytest.raises(PayloadValidationError, match="object"):
        job_type.load_payload(JsonPayload(), b"[1, 2]")


def test_avro_payloads_are_checked_as_decoded_values(app: Pipeline) -> None:
    schema = {
        "type": "record",
        "name": "Resize",
        "namespace": "acme",
        "fields": [{"name": "width", "type": "long"}],
    }

    @app.job("resize", payload=AvroPayload(schema))
    def resize(width: int) -> None: ...

    job_type = app.registry.get("resize")
    codec = job_type.options.payload
    assert codec is not None
    assert job_type.load_payload(codec, codec.encode("resize", {"width": 3})) == {"width": 3}


def test_an_avro_payload_is_checked_at_enqueue_as_the_worker_decodes_it(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    """Enqueue checked the caller's dict: a field the schema defaults was missing and a UUID
    given as text was no UUID, though the worker gets both; what the worker refuses (an enum's
    symbol for an ``int``) is refused at enqueue."""
    schema = {
        "type": "record",
        "name": "Send",
        "namespace": "acme",
        "fields": [
            {"name": "to", "type": "string"},
            {"name": "lang", "type": "string", "default": "en"},
            {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "tone", "type": {"type": "enum", "name": "Tone", "symbols": ["A", "B"]}},
        ],
    }

    @app.job("send", payload=AvroPayload(schema))
    def send(to: str, lang: str, ref: UUID, tone: str) -> None: ...

    ref = "c0a04b71-edac-4aca-9440-ffec92bd09cd"
    app.enqueue("send", {"to": "a", "ref": ref, "tone": "A"})  # lang: the schema's default
    transport.poll()
    job_type = app.registry.get("send")
    codec = job_type.options.payload
    assert codec is not None
    job = app.codec.decode(transport.messages[-1].value)
    loaded = job_type.load_payload(codec, job.payload)
    assert loaded == {"to": "a", "lang": "en", "ref": UUID(ref), "tone": "A"}
    # A schedule of it is checked the same way.
    nightly = make_schedule(
        "nightly", cron="0 3 * * *", job_type="send", payload={"to": "a", "ref": ref, "tone": "A"},
        registered=job_type,
    )  # fmt: skip
    assert job_type.load_payload(codec, nightly.payload)["lang"] == "en"

    @app.job("send.typed", payload=AvroPayload(schema))
    def typed(to: str, lang: str, ref: UUID, tone: int) -> None: ...

    with pytest.raises(PayloadValidationError, match="tone"):  # the worker's check refuses it
        app.enqueue("send.typed", {"to": "a", "ref": ref, "tone": "A"})


def test_handlers_without_annotations_have_no_model_and_take_anything(app: Pipeline) -> None:
    @app.job("loose")
    def loose(a, b=2, *, ctx=None):  # type: ignore[no-untyped-def]
        return a

    @app.job("partly")
    def partly(a, b: int) -> None:  # type: ignore[no-untyped-def]
        ...

    assert app.registry.get("loose").model is None, "nothing to check: no cost at enqueue"
    app.enqueue("loose", {"a": "anything", "b": [1]})
    app.enqueue("partly", {"a": object.__name__, "b": 2})
    with pytest.raises(PayloadValidationError, match="b: Input should be a valid integer"):
        app.enqueue("partly", {"a": 1, "b": "2"})


def test_the_ctx_parameter_is_no_field_and_positional_arguments_fill_fields(
    app: Pipeline, transport: InMemoryTransport
) -> None:
    @app.job("with.ctx")
    def with_ctx(ctx: object, user_id: int, message: str = "") -> None: ...

    with_ctx.enqueue(5, message="x")
    app.flush()
    [job] = transport.jobs("acme.jobs.default")
    assert json.loads(job.payload) == {"user_id": 5, "message": "x"}
    with pytest.raises(PayloadValidationError, match="multiple values"):
        with_ctx.enqueue(5, user_id=6)  # type: ignore[misc]


def test_any_parameter_name_is_a_field(app: Pipeline) -> None:
    @app.job("names")
    def names(schema: str, model_config: int, json: bool, _private: int = 0) -> None: ...

    job_type = app.registry.get("names")
    payload = b'{"schema": "s", "model_config": 1, "json": true, "_private": 2}'
    assert job_type.load_payload(JsonPayload(), payload) == {
        "schema": "s",
        "model_config": 1,
        "json": True,
        "_private": 2,
    }
    with pytest.raises(PayloadValidationError, match="model_config: Input should be a valid"):
        app.enqueue("names", {"schema": "s", "model_config": "1", "json": True})


def test_a_missing_parameter_with_a_default_takes_the_handlers_default(app: Pipeline) -> None:
    @app.job("greet")
    def greet(name: str, greeting: str = "hello") -> str:
        return f"{greeting} {name}"

    job_type = app.registry.get("greet")
    kwargs = job_type.load_payload(JsonPayload(), b'{"name": "ada"}')
    assert kwargs == {"name": "ada"}, "the payload's fields, nothing filled in"
    assert job_type.handler(**kwargs) == "hello ada"
    assert job_type.load_payload(JsonPayload(), b'{"name": "ada", "greeting": "hi"}') == {
        "name": "ada",
        "greeting": "hi",
    }
    with pytest.raises(PayloadValidationError, match="greeting: Input should be a valid string"):
        job_type.load_payload(JsonPayload(), b'{"name": "ada", "greeting": 1}')
