"""Avro single-object encoding and the schema store (DESIGN section 4).

A message is ``C3 01``, then the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema's Parsing Canonical Form, then the Avro binary body. Readers find the writer schema by
fingerprint among every released schema under ``schemas/`` and resolve it against the schema
they want (Avro schema resolution), so old and new writers and readers keep working together.

Each schema is prepared once per process: fastavro parses it, and :mod:`pipeline._avrogen`
generates a writer and a reader for it (about twice as fast as fastavro's interpreter). fastavro
still does schema resolution between versions and whatever the generator leaves out. Unless
asked otherwise the store strips ``logicalType`` from its internal copies, so times stay plain
``int`` milliseconds (as :class:`pipeline.Job` holds them); the Parsing Canonical Form ignores
``logicalType``, so the fingerprint, hence the wire, is the same. (The released schemas carry no
logical types at all: see schemas/README.md.)
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Mapping
from importlib import resources
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import fastavro

from ._avroschema import (
    RegisteredSchema,
    SchemaSource,
    body_error,
    describe_source,
    load_schema,
    prepare,
    schema_names,
)
from ._errors import ConfigurationError, DecodeError, EncodeError, SchemaNotFoundError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

MARKER = b"\xc3\x01"
"""The two bytes every single-object encoded message starts with."""
FINGERPRINT_SIZE = 8
HEADER_SIZE = len(MARKER) + FINGERPRINT_SIZE

_VERSIONED_FILE = re.compile(r"^(?P<stem>.+)\.v(?P<version>[0-9]+)\.avsc$")


@functools.cache
def _packaged(*, logical_types: bool) -> tuple[RegisteredSchema, ...]:
    """The packaged schemas, read and prepared once per process: ``SchemaStore()`` is made by
    every codec, and reading the files took about 1.7 ms each time. The entries are frozen and
    the stores only index them, so every store may share them."""
    store = SchemaStore.empty(logical_types=logical_types)
    return tuple(store.load_directory(default_schema_directory()))


def default_schema_directory() -> Traversable:
    """``schemas/`` as installed in the wheel (``pipeline/_schemas``), else the repository's."""
    packaged = resources.files("pipeline") / "_schemas"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[2] / "schemas"


class SchemaStore:
    """Every known writer schema by fingerprint, and the latest version of each full name.

    ``SchemaStore()`` loads the packaged ``schemas/``; ``SchemaStore(path)`` another tree;
    :meth:`empty` none. ``register`` adds user schemas (job-type payload schemas). Files are
    named ``<name>.v<N>.avsc``; the highest ``N`` of a full name is its current version.
    """

    def __init__(
        self, directory: Path | Traversable | None = None, *, logical_types: bool = False
    ) -> None:
        self._setup(logical_types=logical_types)
        if directory is not None:
            self.load_directory(directory)
            return
        for entry in _packaged(logical_types=logical_types):
            self._index(entry)

    @classmethod
    def empty(cls, *, logical_types: bool = False) -> SchemaStore:
        """A store with no schema in it yet."""
        store = cls.__new__(cls)
        store._setup(logical_types=logical_types)
        return store

    def _setup(self, *, logical_types: bool) -> None:
        self._logical_types = logical_types
        self._by_fingerprint: dict[bytes, RegisteredSchema] = {}
        self._versions: dict[str, dict[int, RegisteredSchema]] = {}
        self._latest: dict[str, RegisteredSchema] = {}

    # -- loading ---------------------------------------------------------------------------

    def load_directory(self, directory: Path | Traversable) -> list[RegisteredSchema]:
        """Registers every ``*.avsc`` file under ``directory`` (recursively)."""
        if not directory.is_dir():
            raise ConfigurationError(f"schema directory {directory} does not exist")
        loaded = []
        for path in sorted(_avsc_files(directory), key=str):
            match = _VERSIONED_FILE.match(path.name)
            if match is None:
                raise ConfigurationError(
                    f"schema file {path} must be named <name>.v<N>.avsc (e.g. job.v2.avsc)"
                )
            schema = load_schema(path.read_text(encoding="utf-8"))
            loaded.append(self.register(schema, version=int(match["version"]), origin=str(path)))
        return loaded

    def register(
        self, schema: SchemaSource, *, version: int | None = None, origin: str | None = None
    ) -> RegisteredSchema:
        """Adds a writer schema; returns the existing entry if it is the same definition.

        Without ``version`` the schema becomes the newest version of its full name, unless
        it is already registered as written (a schema that differs from a registered one
        only in docs, defaults or logical types is a new version, with the same fingerprint).
        """
        raw = load_schema(schema)
        where = origin or describe_source(schema)
        full_name, aliases = schema_names(raw, where)
        try:
            canonical, fp, parsed, compiled = prepare(
                json.dumps(raw, sort_keys=True), logical_types=self._logical_types
            )
        except Exception as exc:
            raise ConfigurationError(f"schema {where} is not a valid Avro schema: {exc}") from exc
        versions = self._versions.setdefault(full_name, {})
        if version is None:
            for same in versions.values():
                if same.fingerprint == fp and same.schema == raw:
                    return same
            version = max(versions, default=0) + 1
        existing = versions.get(version)
        if existing is not None:
            if existing.fingerprint == fp:
                return existing
            raise ConfigurationError(
                f"schema {where}: {full_name} version {version} is already registered with "
                f"another definition; released versions are never edited, add a new .vN.avsc"
            )
        entry = RegisteredSchema(
            full_name=full_name,
            version=version,
            fingerprint=fp,
            canonical_form=canonical,
            schema=raw,
            aliases=aliases,
            parsed=parsed,
            header=MARKER + fp,
            compiled=compiled,
        )
        self._index(entry)
        return entry

    def _index(self, entry: RegisteredSchema) -> None:
        self._versions.setdefault(entry.full_name, {})[entry.version] = entry
        # Versions that differ only in docs or defaults share a fingerprint; the first one
        # indexed serves as writer schema, which is all a fingerprint is used for.
        self._by_fingerprint.setdefault(entry.fingerprint, entry)
        latest = self._latest.get(entry.full_name)
        if latest is None or entry.version > latest.version:
            self._latest[entry.full_name] = entry

    # -- lookups -----------------------------------------------------------------------------

    def latest(self, full_name: str) -> RegisteredSchema:
        """The current version of ``full_name`` (what writers write and readers read as)."""
        try:
            return self._latest[full_name]
        except KeyError:
            raise ConfigurationError(
                f"no schema named {full_name!r} is registered; known: {sorted(self._latest)}"
            ) from None

    def versions(self, full_name: str) -> list[RegisteredSchema]:
        """Every registered version of ``full_name``, oldest first."""
        return [v for _, v in sorted(self._versions.get(full_name, {}).items())]

    def by_fingerprint(self, fp: bytes) -> RegisteredSchema | None:
        return self._by_fingerprint.get(bytes(fp))

    def __iter__(self) -> Iterator[RegisteredSchema]:
        for versions in self._versions.values():
            yield from versions.values()

    def __len__(self) -> int:
        return sum(len(v) for v in self._versions.values())

    def _schema(self, schema: RegisteredSchema | str) -> RegisteredSchema:
        return self.latest(schema) if isinstance(schema, str) else schema

    # -- encoding ----------------------------------------------------------------------------

    def encode(self, record: Mapping[str, Any], schema: RegisteredSchema | str) -> bytes:
        """``record`` in single-object encoding; ``schema`` is an entry or a full name (latest)."""
        entry = self._schema(schema)
        try:
            if entry.compiled is not None:
                out = [entry.header]
                entry.compiled.write(record, out)
                return b"".join(out)
            buffer = BytesIO()
            buffer.write(entry.header)
            fastavro.schemaless_writer(buffer, entry.parsed, record)
            return buffer.getvalue()
        except Exception as exc:
            raise EncodeError(
                f"cannot encode a {entry.full_name}: {type(exc).__name__}: {exc}"
            ) from exc

    def writer_of(self, data: bytes) -> RegisteredSchema:
        """The writer schema named by ``data``'s header; raises DecodeError if there is none."""
        if data[:2] != MARKER:
            raise DecodeError(_bad_marker(data), bytes(data))
        writer = self._by_fingerprint.get(bytes(data[2:HEADER_SIZE]))
        if writer is None:
            if len(data) < HEADER_SIZE:
                raise DecodeError(
                    f"truncated message: {len(data)} bytes, shorter than the "
                    f"{HEADER_SIZE}-byte single-object header",
                    bytes(data),
                )
            fp = bytes(data[2:HEADER_SIZE]).hex()
            raise SchemaNotFoundError(
                f"unknown writer schema fingerprint {fp}: the message was written with a schema "
                f"this reader does not have; add that schema version under schemas/ "
                f"(or register it) and upgrade the reader",
                bytes(data),
            )
        return writer

    def decode(self, data: bytes, reader: RegisteredSchema | str | None = None) -> Any:
        """Decodes a single-object encoded message.

        ``reader`` is the schema to read as (an entry or a full name: its latest version);
        ``None`` reads as the writer schema. Raises :class:`DecodeError` (with ``raw``) for
        anything that is not a complete, valid message of a compatible schema.
        """
        if type(data) is not bytes:
            data = bytes(data)
        writer = self._by_fingerprint.get(data[2:HEADER_SIZE])
        if writer is None or data[:2] != MARKER:
            writer = self.writer_of(data)  # raises the error that fits
        if reader is None or reader is writer:
            reader_entry = writer
        else:
            reader_entry = self._schema(reader)
            if reader_entry.fingerprint == writer.fingerprint:
                # The same canonical form, so the same binary: read as the reader's own version
                # (its defaults and logical types, and its generated reader).
                writer = reader_entry
            elif not reader_entry.answers_to(writer.full_name):
                raise DecodeError(
                    f"expected a {reader_entry.full_name} but the message is a "
                    f"{writer.full_name} (fingerprint {writer.fingerprint_hex})",
                    data,
                )
        try:
            if reader_entry is writer and writer.compiled is not None:
                record, end = writer.compiled.read(data, HEADER_SIZE)
            else:
                buffer = BytesIO(data)
                buffer.seek(HEADER_SIZE)
                reader_parsed = None if reader_entry is writer else reader_entry.parsed
                record = fastavro.schemaless_reader(buffer, writer.parsed, reader_parsed)
                end = buffer.tell()
        except Exception as exc:
            raise DecodeError(
                f"cannot decode the {writer.full_name} body (writer version {writer.version}, "
                f"fingerprint {writer.fingerprint_hex}, {len(data)} bytes): {body_error(exc)}",
                data,
            ) from exc
        if end != len(data):
            raise DecodeError(
                f"{len(data) - end} unexpected bytes after the {writer.full_name} body", data
            )
        return record


def _avsc_files(directory: Path | Traversable) -> Iterator[Traversable]:
    for child in directory.iterdir():
        if child.is_dir():
            yield from _avsc_files(child)
        elif child.name.endswith(".avsc"):
            yield child


def _bad_marker(data: bytes) -> str:
    if not data:
        return "empty message: expected an Avro single-object encoded value (C3 01 ...)"
    if len(data) < 2:
        return f"truncated message: {len(data)} byte(s), no room for the C3 01 marker"
    hint = ""
    if data[:1] in (b"{", b"["):
        hint = "; it looks like JSON: write jobs as Avro (see docs/wire-format.md)"
    elif data[:1] == b"\x00":
        hint = (
            "; it looks like a schema registry's wire format: set schema_registry.url to read "
            "it (docs/schema-registry.md)"
        )
    return (
        f"not Avro single-object encoding: starts with {bytes(data[:2]).hex(' ')}, "
        f"expected c3 01 ({len(data)} bytes){hint}"
    )
