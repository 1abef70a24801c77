"""Single-object encoding and the schema store, checked against the Avro spec independently."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline._avro import (
    HEADER_SIZE,
    MARKER,
    SchemaStore,
    _packaged,
    default_schema_directory,
)
from pipeline._avroschema import canonical_form, fingerprint
from pipeline._errors import ConfigurationError, DecodeError, EncodeError, SchemaNotFoundError

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"

# -- an independent CRC-64-AVRO (Rabin) fingerprint, written from the Avro specification -----

_EMPTY = 0xC15D213AA4D7A795


def _table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp & 0xFFFF_FFFF_FFFF_FFFF)
    return table


_TABLE = _table()


def rabin64(data: bytes) -> int:
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def spec_fingerprint(schema: Any) -> bytes:
    """What the spec says follows ``C3 01``: the 64-bit fingerprint, little-endian."""
    return rabin64(canonical_form(schema).encode("utf-8")).to_bytes(8, "little")


# -- fingerprints ------------------------------------------------------------------------------


def test_reference_fingerprint_of_int_is_pinned() -> None:
    assert canonical_form("int") == '"int"'
    assert rabin64(b'"int"') == 0x7275D51A3F395C8F
    assert fingerprint("int") == bytes.fromhex("8f5c393f1ad57572")
    assert fingerprint("int") == (0x7275D51A3F395C8F).to_bytes(8, "little")


@pytest.mark.parametrize("schema", ["string", "long", "null", {"type": "array", "items": "int"}])
def test_fingerprint_matches_the_spec_algorithm(schema: Any) -> None:
    assert fingerprint(schema) == spec_fingerprint(schema)


@pytest.mark.parametrize("path", sorted(SCHEMAS.rglob("*.avsc")), ids=lambda p: p.name)
def test_every_released_schema_header_is_marker_plus_little_endian_fingerprint(path: Path) -> None:
    raw = json.loads(path.read_text(encoding="utf-8"))
    store = SchemaStore()
    version = int(path.name.rsplit(".v", 1)[1].removesuffix(".avsc"))
    (entry,) = [
        v for v in store.versions(f"{raw['namespace']}.{raw['name']}") if v.version == version
    ]
    assert entry.header == MARKER + spec_fingerprint(raw)
    data = store.encode(_minimal_record(raw), entry)
    assert data[:HEADER_SIZE] == b"\xc3\x01" + spec_fingerprint(raw)


# Released schemas are never edited in place: a change of canonical form (the wire contract)
# must fail here. Add a new .vN.avsc instead, and pin its fingerprint below.
RELEASED = {
    "pipeline.Job": {1: "8dea1b6bdd77221b"},
    "pipeline.DeadLetter": {1: "df184ad0a3649fd0", 2: "9e8374d3efd78b02"},
    "pipeline.Event": {1: "b2827e6f86d01618"},
    "pipeline.Schedule": {1: "1cd22f50fb592237", 2: "ef115612166ea4ab"},
}


def test_released_schemas_are_pinned() -> None:
    store = SchemaStore(SCHEMAS)
    found = {
        name: {v.version: v.fingerprint_hex for v in store.versions(name)} for name in RELEASED
    }
    assert found == RELEASED
    assert sorted({e.full_name for e in store}) == sorted(RELEASED)


def _nodes(node: Any, depth: int = 0) -> Any:
    if isinstance(node, dict):
        yield node, depth
        for value in node.values():
            yield from _nodes(value, depth + 1)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value, depth + 1)


@pytest.mark.parametrize("path", sorted(SCHEMAS.rglob("*.avsc")), ids=lambda p: p.name)
def test_released_schemas_fingerprint_the_same_in_every_library(path: Path) -> None:
    """No logicalType and no nested namespace: Go's goavro and hamba/avro get these wrong.

    Both put ``logicalType`` (or ``{"type": "long"}``) into their canonical form, and goavro
    doubles a nested type's explicit namespace, so their single-object header would name a
    schema no reader has. Times are documented ``long`` milliseconds instead.
    """
    raw = json.loads(path.read_text(encoding="utf-8"))
    for node, depth in _nodes(raw):
        assert "logicalType" not in node
        assert depth == 0 or "namespace" not in node


def test_logical_types_do_not_change_the_fingerprint() -> None:
    with_logical = {
        "type": "record",
        "name": "T",
        "fields": [{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    without = {"type": "record", "name": "T", "fields": [{"name": "at", "type": "long"}]}
    assert canonical_form(with_logical) == canonical_form(without)
    assert spec_fingerprint(with_logical) == spec_fingerprint(without)
    stripped = SchemaStore.empty().register(with_logical)
    kept = SchemaStore.empty(logical_types=True).register(with_logical)
    assert stripped.header == kept.header == MARKER + spec_fingerprint(without)


def test_timestamps_stay_integers_unless_the_store_keeps_logical_types() -> None:
    schema = {
        "type": "record",
        "name": "T",
        "fields": [{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}],
    }
    plain = SchemaStore.empty()
    entry = plain.register(schema)
    data = plain.encode({"at": 1735689600000}, entry)
    assert plain.decode(data) == {"at": 1735689600000}
    logical = SchemaStore.empty(logical_types=True)
    logical.register(schema)
    assert logical.decode(data) == {"at": datetime(2025, 1, 1, tzinfo=UTC)}


# -- the store ---------------------------------------------------------------------------------


def test_default_store_loads_the_repository_schemas() -> None:
    assert Path(str(default_schema_directory())).resolve() == SCHEMAS
    store = SchemaStore()
    assert len(store) == len(list(SCHEMAS.rglob("*.avsc")))
    job = store.latest("pipeline.Job")
    assert job.version == 1
    assert store.by_fingerprint(job.fingerprint) is job
    assert job.schema["doc"]


def test_an_installed_wheel_uses_its_packaged_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyproject force-includes schemas/ as pipeline/_schemas; that copy wins when present."""
    (tmp_path / "_schemas" / "pipeline").mkdir(parents=True)
    copied = [path for path in (SCHEMAS / "pipeline").glob("*.avsc") if path.stem != "event.v1"]
    for path in copied:
        (tmp_path / "_schemas" / "pipeline" / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr("pipeline._avro.resources.files", lambda package: tmp_path)
    assert default_schema_directory() == tmp_path / "_schemas"
    _packaged.cache_clear()  # the packaged schemas are read once a process
    try:
        store = SchemaStore()
        assert len(store) == len(copied) == sum(map(len, RELEASED.values())) - 1
        with pytest.raises(ConfigurationError, match=r"no schema named 'pipeline\.Event'"):
            store.latest("pipeline.Event")
    finally:
        _packaged.cache_clear()


def test_default_stores_share_the_packaged_schemas_and_nothing_registered_later() -> None:
    first, second = SchemaStore(), SchemaStore()
    assert [a is b for a, b in zip(first, second, strict=True)] == [True] * len(first)
    added = first.register(_record("Thing", {"name": "a", "type": "string"}))
    assert first.latest("acme.Thing") is added
    with pytest.raises(ConfigurationError, match=r"no schema named 'acme\.Thing'"):
        second.latest("acme.Thing")
    assert len(SchemaStore()) == len(second) == len(first) - 1


def _write(directory: Path, name: str, schema: dict[str, Any]) -> Path:
    path = directory / name
    path.write_text(json.dumps(schema), encoding="utf-8")
    return path


def _record(name: str, *fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "acme", "fields": list(fields)}


def test_latest_version_is_the_highest_file_version(tmp_path: Path) -> None:
    (tmp_path / "nested").mkdir()
    v1 = _record("Thing", {"name": "a", "type": "string"})
    v2 = _record(
        "Thing", {"name": "a", "type": "string"}, {"name": "b", "type": "int", "default": 0}
    )
    _write(tmp_path / "nested", "thing.v10.avsc", v2)
    _write(tmp_path, "thing.v9.avsc", v1)
    store = SchemaStore(tmp_path)
    assert store.latest("acme.Thing").version == 10
    assert [v.version for v in store.versions("acme.Thing")] == [9, 10]


def test_unversioned_file_names_are_refused(tmp_path: Path) -> None:
    _write(tmp_path, "thing.avsc", _record("Thing", {"name": "a", "type": "string"}))
    with pytest.raises(ConfigurationError, match=r"<name>\.v<N>\.avsc"):
        SchemaStore(tmp_path)


def test_a_version_cannot_be_redefined(tmp_path: Path) -> None:
    store = SchemaStore.empty()
    store.register(_record("Thing", {"name": "a", "type": "string"}), version=1)
    with pytest.raises(ConfigurationError, match="never edited"):
        store.register(_record("Thing", {"name": "a", "type": "long"}), version=1)


def test_register_is_idempotent_and_appends_versions() -> None:
    store = SchemaStore.empty()
    first = store.register(_record("Thing", {"name": "a", "type": "string"}))
    assert store.register(json.dumps(first.schema)) is first
    second = store.register(_record("Thing", {"name": "a", "type": "long"}))
    assert (first.version, second.version) == (1, 2)
    assert store.latest("acme.Thing") is second


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("[1, 2", "not valid JSON"),
        ('"string"', "JSON object"),
        ('{"type": "array", "items": "int"}', "named type"),
        (
            '{"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope"}]}',
            "valid Avro",
        ),
    ],
)
def test_bad_schemas_are_configuration_errors(schema: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        SchemaStore.empty().register(schema)


def test_unknown_name_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"acme\.Nope"):
        SchemaStore.empty().latest("acme.Nope")


def test_encode_error_names_the_record() -> None:
    store = SchemaStore()
    with pytest.raises(EncodeError, match=r"pipeline\.Event"):
        store.encode({"job_id": 1}, "pipeline.Event")


# -- decoding failures -------------------------------------------------------------------------


def _minimal_record(schema: dict[str, Any]) -> dict[str, Any]:
    samples: dict[str, Any] = {"string": "s", "bytes": b"b", "int": 1, "long": 2, "boolean": True}
    record: dict[str, Any] = {}
    for f in schema["fields"]:
        kind = f["type"]
        if "default" in f:
            continue
        if isinstance(kind, dict):
            kind = kind["type"]
        record[f["name"]] = samples[kind]
    return record


@pytest.fixture(scope="module")
def store() -> SchemaStore:
    return SchemaStore()


@pytest.fixture(scope="module")
def event_bytes(store: SchemaStore) -> bytes:
    record = {"job_id": "j", "job_type": "t", "kind": "started", "at": 1, "attempt": 1}
    return store.encode({**record, "priority": "high", "detail": "x" * 40}, "pipeline.Event")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty message"),
        (b"\xc3", "truncated message: 1 byte"),
        (b'{"id": "x"}', "not Avro single-object encoding: starts with 7b 22"),
        (b"\x00\x00\x00\x00\x01\x02", "starts with 00 00, expected c3 01 (6 bytes); it looks like"),
        (b"\xc3\x01\x8d\xea", "shorter than the 10-byte"),
    ],
)
def test_framing_errors_have_clear_reasons(store: SchemaStore, data: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as info:
        store.decode(data)
    assert reason in info.value.reason
    assert info.value.raw == data
    assert type(info.value) is DecodeError


def test_unknown_fingerprint(store: SchemaStore, event_bytes: bytes) -> None:
    data = MARKER + bytes.fromhex("0102030405060708") + event_bytes[HEADER_SIZE:]
    with pytest.raises(SchemaNotFoundError, match="0102030405060708") as info:
        store.decode(data)
    assert info.value.raw == data


def test_every_truncation_is_a_decode_error(store: SchemaStore, event_bytes: bytes) -> None:
    for cut in range(len(event_bytes)):
        with pytest.raises(DecodeError) as info:
            store.decode(event_bytes[:cut], "pipeline.Event")
        assert info.value.raw == event_bytes[:cut]


def test_trailing_bytes_are_a_decode_error(store: SchemaStore, event_bytes: bytes) -> None:
    with pytest.raises(DecodeError, match="1 unexpected bytes"):
        store.decode(event_bytes + b"\x00")


def test_reading_as_another_record_is_a_decode_error(
    store: SchemaStore, event_bytes: bytes
) -> None:
    with pytest.raises(DecodeError, match=r"expected a pipeline\.Job .* pipeline\.Event"):
        store.decode(event_bytes, "pipeline.Job")


def test_garbage_body_is_a_decode_error(store: SchemaStore, event_bytes: bytes) -> None:
    bad_utf8 = event_bytes[:HEADER_SIZE] + b"\x04\xff\xfe" + event_bytes[HEADER_SIZE + 3 :]
    with pytest.raises(DecodeError, match=r"cannot decode the pipeline\.Event body") as info:
        store.decode(bad_utf8)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)
