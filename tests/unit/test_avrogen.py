"""The generated fast path writes and reads exactly what fastavro does, and refuses the rest."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import _avrogen, _jobtemplate
from pipeline._avro import SchemaStore
from pipeline._avrogen import Compiled, compile_schema
from pipeline._codec import AvroPayload

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

EVERYTHING: dict[str, Any] = {
    "type": "record",
    "name": "Everything",
    "namespace": "test",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "y", "type": "bytes", "default": "\u00ff"},
        {"name": "n", "type": "null"},
        {"name": "e", "type": {"type": "enum", "name": "Colour", "symbols": ["RED", "GREEN"]}},
        {"name": "x", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "later", "type": ["string", "null"]},
        {"name": "single", "type": ["long"]},
        {
            "name": "inner",
            "type": {
                "type": "record",
                "name": "Inner",
                "fields": [
                    {"name": "colour", "type": "Colour"},
                    {
                        "name": "grid",
                        "type": {"type": "array", "items": {"type": "array", "items": "int"}},
                    },
                ],
            },
        },
        {"name": "again", "type": ["null", "test.Inner"]},
        {"name": "by_name", "type": {"type": "map", "values": {"type": "map", "values": "Four"}}},
    ],
}


def _released() -> list[dict[str, Any]]:
    return [json.loads(p.read_text("utf-8")) for p in sorted(SCHEMAS.rglob("*.avsc"))]


def _store_entry(schema: dict[str, Any]) -> tuple[Any, Compiled]:
    entry = SchemaStore.empty().register(schema)
    assert entry.compiled is not None, entry.full_name
    return entry.parsed, entry.compiled


def values(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:  # noqa: PLR0911
    """Values of a parsed schema (logical types stripped, as the store keeps them)."""
    if isinstance(schema, list):
        return st.one_of(*[values(branch, named) for branch in schema])
    if isinstance(schema, str) and schema in named:
        return values(named[schema], named)
    kind = schema if isinstance(schema, str) else schema["type"]
    simple: dict[str, st.SearchStrategy[Any]] = {
        "null": st.none(),
        "boolean": st.booleans(),
        "int": st.integers(-(2**31), 2**31 - 1),
        "long": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(width=32, allow_nan=False),
        "double": st.floats(allow_nan=False),
        "string": st.text(max_size=20),
        "bytes": st.binary(max_size=20),
    }
    if kind in simple:
        return simple[kind]
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "fixed":
        return st.binary(min_size=schema["size"], max_size=schema["size"])
    if kind == "array":
        return st.lists(values(schema["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), values(schema["values"], named), max_size=3)
    return st.fixed_dictionaries({f["name"]: values(f["type"], named) for f in schema["fields"]})


def _fastavro_bytes(parsed: Any, record: Any) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, parsed, record)
    return buffer.getvalue()


def _fastavro_read(parsed: Any, body: bytes) -> tuple[Any, int]:
    buffer = io.BytesIO(body)
    return fastavro.schemaless_reader(buffer, parsed, None), buffer.tell()


def _write(compiled: Compiled, record: Any) -> bytes:
    out: list[bytes] = []
    compiled.write(record, out)
    return b"".join(out)


@dataclass(frozen=True)
class Case:
    parsed: Any
    compiled: Compiled
    records: st.SearchStrategy[Any]


def _case(schema: dict[str, Any]) -> Case:
    parsed, compiled = _store_entry(schema)
    return Case(parsed, compiled, values(parsed, parsed["__named_schemas"]))


# Strategies are built once per schema: building them per example is what makes Hypothesis slow.
CASES = {s["name"]: _case(s) for s in [*_released(), EVERYTHING]}


@pytest.fixture(params=sorted(CASES), scope="module")
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_same_bytes_and_values_as_fastavro(case: Case, data: st.DataObject) -> None:
    record = data.draw(case.records)
    body = _write(case.compiled, record)
    assert body == _fastavro_bytes(case.parsed, record)
    assert case.compiled.read(body, 0) == _fastavro_read(case.parsed, body) == (record, len(body))


@settings(max_examples=120, deadline=None)
@given(data=st.data(), noise=st.binary(max_size=120))
def test_garbage_reads_like_fastavro_or_fails(
    case: Case, data: st.DataObject, noise: bytes
) -> None:
    valid = _write(case.compiled, data.draw(case.records))
    cut = data.draw(st.integers(0, len(valid)))
    body = valid[:cut] + noise
    try:
        ours = case.compiled.read(body, 0)
    except Exception:  # a failure of any type: the store wraps it in DecodeError
        return
    assert ours == _fastavro_read(case.parsed, body)


def test_missing_fields_take_their_defaults() -> None:
    parsed, compiled = _store_entry(EVERYTHING)
    record = {
        "b": True,
        "i": 1,
        "l": 2,
        "f": 0.5,
        "d": 0.25,
        "s": "s",
        "n": None,
        "e": "RED",
        "x": b"1234",
        "later": None,
        "single": 3,
        "inner": {"colour": "GREEN", "grid": [[1], []]},
        "again": None,
        "by_name": {},
    }
    body = _write(compiled, record)
    assert body == _fastavro_bytes(parsed, {**record, "y": b"\xff"})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("i", 2**31, "does not fit an Avro int"),
        ("l", 2**63, "does not fit an Avro long"),
        ("i", 1.5, None),
        ("s", b"x", None),
        ("y", "x", "expected bytes"),
        ("e", "BLUE", "BLUE"),
        ("x", b"123", "fixed size is 4"),
        ("n", 0, "expected null"),
    ],
)
def test_bad_values_raise(field: str, value: Any, message: str | None) -> None:
    _, compiled = _store_entry(EVERYTHING)
    record = {
        **dict.fromkeys(("b", "i", "l", "f", "d", "single"), 0),
        **{"s": "", "y": b"", "e": "RED", "x": b"1234", "n": None, "later": None},
        **{"inner": {"colour": "RED", "grid": []}, "again": None, "by_name": {}},
    }
    _write(compiled, record)  # valid as it is
    with pytest.raises((ValueError, TypeError, KeyError, AttributeError), match=message):
        _write(compiled, {**record, field: value})


PRICE: dict[str, Any] = {
    "type": "record",
    "name": "Price",
    "fields": [
        {
            "name": "amount",
            "type": {
                "type": "fixed",
                "name": "Money",
                "size": 8,
                "logicalType": "decimal",
                "precision": 18,
                "scale": 2,
            },
        },
        {"name": "again", "type": "Money"},
    ],
}
"""A logical type on a named type, used twice."""


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "record", "name": "U", "fields": [{"name": "u", "type": ["int", "string"]}]},
        {
            "type": "record",
            "name": "Node",
            "fields": [{"name": "next", "type": ["null", "Node"]}],
        },
        {
            "type": "record",
            "name": "Nulls",
            "fields": [{"name": "a", "type": {"type": "array", "items": "null"}}],
        },
        {
            "type": "record",
            "name": "Logical",
            "fields": [{"name": "d", "type": {"type": "int", "logicalType": "date"}}],
        },
        PRICE,
    ],
    ids=["union", "recursive", "array-of-null", "logical", "logical-on-a-named-type"],
)
def test_unsupported_schemas_are_left_to_fastavro(schema: dict[str, Any]) -> None:
    assert compile_schema(fastavro.parse_schema(schema, named_schemas={})) is None
    store = SchemaStore.empty(logical_types=True)
    entry = store.register(schema)
    assert entry.compiled is None


def test_a_decimal_on_a_fixed_type_round_trips_as_a_decimal() -> None:
    store = SchemaStore.empty(logical_types=True)
    entry = store.register(PRICE)
    value = {"amount": Decimal("12.34"), "again": Decimal("-0.01")}
    assert store.decode(store.encode(value, entry)) == value


def test_fastavro_fallback_still_round_trips() -> None:
    schema = {"type": "record", "name": "U", "fields": [{"name": "u", "type": ["int", "string"]}]}
    store = SchemaStore.empty()
    entry = store.register(schema)
    assert entry.compiled is None
    for value in (5, "five"):
        assert store.decode(store.encode({"u": value}, entry)) == {"u": value}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"\x80" * 11, ValueError),  # a varint that never ends
        (b"\x01", ValueError),  # a string of length -1
        (b"\x04a", EOFError),  # a string longer than what is left
    ],
)
def test_malformed_bodies(body: bytes, error: type[Exception]) -> None:
    schema = {"type": "record", "name": "S", "fields": [{"name": "s", "type": "string"}]}
    _, compiled = _store_entry(schema)
    with pytest.raises(error):
        compiled.read(body, 0)


def test_enum_and_union_indexes_are_checked() -> None:
    schema = {
        "type": "record",
        "name": "E",
        "fields": [
            {"name": "e", "type": {"type": "enum", "name": "AB", "symbols": ["A", "B"]}},
            {"name": "o", "type": ["null", "int"]},
        ],
    }
    _, compiled = _store_entry(schema)
    assert compiled.read(b"\x02\x02\x04", 0) == ({"e": "B", "o": 2}, 3)
    with pytest.raises(ValueError, match="enum index -1"):
        compiled.read(b"\x01\x00", 0)
    with pytest.raises(ValueError, match="enum index 2"):
        compiled.read(b"\x04\x00", 0)
    with pytest.raises(ValueError, match="union index 2"):
        compiled.read(b"\x00\x04", 0)


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**40])
def test_an_int_outside_32_bits_is_refused(value: int) -> None:
    # Read, it could never be written again: a job carrying one could not be retried or moved.
    schema = {"type": "record", "name": "I", "fields": [{"name": "i", "type": "int"}]}
    _, compiled = _store_entry(schema)
    assert compiled.read(_avrogen.encode_long(2**31 - 1), 0) == ({"i": 2**31 - 1}, 5)
    with pytest.raises(ValueError, match="does not fit an Avro int"):
        compiled.read(_avrogen.encode_long(value), 0)


@pytest.mark.parametrize("body", [b"\xff" * 9 + b"\x7f", b"\xfe" + b"\xff" * 8 + b"\x01"])
def test_ten_byte_varints_wrap_to_64_bits_like_fastavro(body: bytes) -> None:
    schema = {"type": "record", "name": "L", "fields": [{"name": "l", "type": "long"}]}
    parsed, compiled = _store_entry(schema)
    ours = compiled.read(body, 0)
    assert ours == _fastavro_read(parsed, body)
    assert -(2**63) <= ours[0]["l"] < 2**63


def test_the_job_template_encodes_longs_with_the_schema_writers_encoder() -> None:
    assert vars(_jobtemplate)["encode_long"] is _avrogen.encode_long  # one encoder, no copy
    assert _avrogen.encode_long(-1) == b"\x01"
    assert _avrogen.encode_long(64) == b"\x80\x01"
    with pytest.raises(ValueError, match="does not fit an Avro long"):
        _avrogen.encode_long(1 << 63)


@pytest.mark.parametrize(
    "kind", ["bytes", ["bytes", "null"], {"type": "fixed", "name": "F", "size": 2}]
)
def test_a_bytes_default_is_bytes_whether_or_not_in_a_union(kind: object) -> None:
    """A JSON default of bytes is ISO-8859-1 text, also for a union whose first branch is
    bytes: left as text, every payload that left the field out was refused at enqueue."""
    schema = {
        "type": "record",
        "name": "P",
        "namespace": "acme",
        "fields": [
            {"name": "a", "type": "int"},
            {"name": "b", "type": kind, "default": "\u00ff\u0001"},
        ],
    }
    payload = AvroPayload(schema)
    assert payload.decode("x", payload.encode("x", {"a": 1})) == {"a": 1, "b": b"\xff\x01"}
