"""Avro schemas, one at a time: names, Parsing Canonical Form, fingerprints, preparation.

What :class:`pipeline._avro.SchemaStore` needs to know of a single schema: its full name and
aliases, its canonical form and CRC-64-AVRO fingerprint, and fastavro's parsed copy with the
generated codec of :mod:`pipeline._avrogen`, prepared once per process.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from ._avrogen import Compiled, compile_schema
from ._errors import ConfigurationError

SchemaSource = Mapping[str, Any] | str | Path
"""A schema as a dict (parsed JSON), a JSON string, or the path of an ``.avsc`` file (a ``Path``,
or a ``str`` ending in ``.avsc``)."""


_NAMED_TYPES = frozenset({"record", "error", "enum", "fixed"})


@dataclass(frozen=True, slots=True, eq=False, repr=False)
class RegisteredSchema:
    """One version of a named schema, parsed once and ready to read and write."""

    full_name: str
    version: int
    fingerprint: bytes
    """The 8 bytes that follow the marker on the wire (little-endian CRC-64-AVRO)."""
    canonical_form: str
    schema: Mapping[str, Any]
    """The schema as written, with docs, defaults and logical types."""
    aliases: frozenset[str]
    parsed: Any
    """fastavro's parsed copy (logical types stripped unless the store keeps them)."""
    header: bytes
    """``MARKER + fingerprint``: the first 10 bytes of every message written with this schema."""
    compiled: Compiled | None = None
    """Generated writer and reader (see :mod:`pipeline._avrogen`); ``None``: fastavro only."""

    def __repr__(self) -> str:
        return f"RegisteredSchema({self.full_name} v{self.version}, {self.fingerprint_hex})"

    @property
    def fingerprint_hex(self) -> str:
        return self.fingerprint.hex()

    def answers_to(self, full_name: str) -> bool:
        """Whether data written as ``full_name`` may be read with this schema."""
        return full_name == self.full_name or full_name in self.aliases


def canonical_form(schema: Mapping[str, Any] | str) -> str:
    """The schema's Parsing Canonical Form (Avro spec), which fingerprints are taken of."""
    return str(to_parsing_canonical_form(schema if isinstance(schema, str) else dict(schema)))


def fingerprint(schema: Mapping[str, Any] | str) -> bytes:
    """The schema's CRC-64-AVRO fingerprint, as the 8 bytes single-object encoding writes."""
    return _fingerprint_of_canonical(canonical_form(schema))


def _fingerprint_of_canonical(canonical: str) -> bytes:
    # fastavro renders the 64-bit value as hex of its little-endian bytes, the wire order
    # (pinned against the spec's reference algorithm in tests/unit/test_avro.py).
    return bytes.fromhex(_fastavro_fingerprint(canonical, "CRC-64-AVRO"))


def load_schema(source: SchemaSource) -> dict[str, Any]:
    """Reads a schema given as a dict, a JSON string or an ``.avsc`` path (a ``str`` ending in
    ``.avsc`` is one: a schema's JSON is an object, which cannot end so)."""
    if isinstance(source, str) and source.strip().endswith(".avsc"):
        source = Path(source.strip())
    if isinstance(source, Path):
        try:
            text = source.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read the schema file {source}: {exc}") from exc
    elif isinstance(source, str):
        text = source
    else:
        return dict(source)
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(
            f"schema {describe_source(source)} is not valid JSON: {exc}"
        ) from exc
    if not isinstance(loaded, dict):
        raise ConfigurationError(
            f"schema {describe_source(source)} must be a JSON object naming a record, enum or fixed"
        )
    return loaded


@functools.lru_cache(maxsize=256)
def prepare(schema_json: str, *, logical_types: bool) -> tuple[str, bytes, Any, Compiled | None]:
    """Canonical form, fingerprint, fastavro's parsed copy and generated codec of a schema.

    Cached: every ``SchemaStore()`` of a process shares the work (and neither result is ever
    mutated), so creating stores, e.g. one per ``Pipeline``, stays cheap.
    """
    raw = json.loads(schema_json)
    canonical = canonical_form(raw)
    parsed = fastavro.parse_schema(
        raw if logical_types else strip_logical_types(raw), named_schemas={}
    )
    return canonical, _fingerprint_of_canonical(canonical), parsed, compile_schema(parsed)


def schema_names(schema: Mapping[str, Any], where: str) -> tuple[str, frozenset[str]]:
    kind = schema.get("type")
    name = schema.get("name")
    if kind not in _NAMED_TYPES or not isinstance(name, str):
        raise ConfigurationError(
            f"schema {where} must be a named type (record, enum or fixed) with a name"
        )
    namespace = schema.get("namespace")
    full_name = name if "." in name or not namespace else f"{namespace}.{name}"
    space = full_name.rpartition(".")[0]
    aliases = frozenset(
        a if "." in a or not space else f"{space}.{a}" for a in schema.get("aliases", ())
    )
    return full_name, aliases


def strip_logical_types(node: Any) -> Any:
    """A copy of a schema without ``logicalType``, touching schema nodes only (not defaults)."""
    if isinstance(node, list):
        return [strip_logical_types(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if k != "logicalType"}
    if "type" in node:
        out["type"] = strip_logical_types(node["type"])
    for key in ("items", "values"):
        if key in node:
            out[key] = strip_logical_types(node[key])
    if "fields" in node:
        out["fields"] = [strip_logical_types(f) for f in node["fields"]]
    return out


def describe_source(source: SchemaSource) -> str:
    if isinstance(source, Path):
        return str(source)
    if isinstance(source, Mapping):
        return repr(source.get("name", "<unnamed>"))
    return "<JSON string>"


def body_error(exc: Exception) -> str:
    """What went wrong reading a body: a read past its end says so (a number cut off raises a
    bare ``IndexError``, fastavro an ``EOFError`` with no text)."""
    if isinstance(exc, IndexError) or (isinstance(exc, EOFError) and not str(exc)):
        return "truncated: the body ends inside a field"
    return f"{type(exc).__name__}: {exc}"
