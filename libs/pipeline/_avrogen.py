"""Avro binary writers and readers generated from a schema: the fast path of the schema store.

fastavro interprets a schema for every record, which costs about half a microsecond per field;
the worker decodes tens of thousands of jobs a second, so the store turns each schema into
straight-line Python once (field order, enum tables and small varints resolved up front) and
keeps fastavro for everything else: schema resolution between versions and logical types.

Only a subset is compiled: every primitive, records, enums, fixed, arrays, maps, named
references and unions of ``null`` with one other type. Anything else (other unions, recursive
types, items that take no bytes) makes :func:`compile_schema` return ``None`` and the store uses
fastavro. Names in the generated code come from the generator, never from the schema; schema
strings (field names, symbols) only appear as ``repr`` literals or table entries.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Writer = Callable[[Mapping[str, Any], list[bytes]], None]
"""Appends the body of a record to a list of byte strings."""
Reader = Callable[[bytes, int], tuple[Any, int]]
"""Reads a body from ``data`` at an offset; returns the value and the offset after it."""

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
"""What an Avro ``int`` holds (32 bits); readers of other writers check against it too."""
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
# Zig-zag varints of -64..63 are one byte; most lengths, counts and small ints are among them.
_SMALL = tuple(bytes([((n << 1) ^ (n >> 63)) & 0xFF]) for n in range(-64, 64))


class Unsupported(Exception):  # noqa: N818 - a signal, not an error
    """The schema uses something this generator leaves to fastavro."""


@dataclass(frozen=True, slots=True)
class Compiled:
    write: Writer
    read: Reader


def encode_long(n: int) -> bytes:
    """Avro's zig-zag varint of a long; ``ValueError`` outside 64 bits."""
    if not _LONG_MIN <= n <= _LONG_MAX:
        raise ValueError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _int(n: int) -> bytes:
    if not INT_MIN <= n <= INT_MAX:
        raise ValueError(f"{n} does not fit an Avro int (32 bits)")
    return encode_long(n)


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    pos += 1
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        shift += 7
    n &= 0xFFFF_FFFF_FFFF_FFFF  # a long is 64 bits, whatever a 10th byte says
    return (n >> 1) ^ -(n & 1), pos


def _read_int(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro int: a varint in 32 bits (Java's readers refuse others; a value read past them
    could never be written again, so a job carrying one could not be retried or moved)."""
    n, pos = _read_long(data, pos)
    if not INT_MIN <= n <= INT_MAX:
        raise ValueError(f"{n} does not fit an Avro int (32 bits)")
    return n, pos


def _eof(needed: int, pos: int, size: int) -> EOFError:
    return EOFError(f"needs {needed} bytes at offset {pos}, only {size - pos} left")


def _bad_size(n: int, pos: int, size: int) -> Exception:
    return ValueError(f"negative length {n}") if n < 0 else _eof(n, pos, size)


def _bad_index(kind: str, n: int) -> ValueError:
    return ValueError(f"{kind} index {n} out of range")


_GLOBALS: dict[str, Any] = {
    "_SMALL": _SMALL,
    "_long": encode_long,
    "_int": _int,
    "_read_long": _read_long,
    "_read_int": _read_int,
    "_eof": _eof,
    "_bad_size": _bad_size,
    "_bad_index": _bad_index,
    "_pack_f": struct.Struct("<f").pack,
    "_pack_d": struct.Struct("<d").pack,
    "_unpack_f": struct.Struct("<f").unpack_from,
    "_unpack_d": struct.Struct("<d").unpack_from,
}


def compile_schema(parsed: Any) -> Compiled | None:
    """Writer and reader for a fastavro-parsed schema without logical types, or ``None``."""
    try:
        gen = _Generator(parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {})
        write_src = gen.writer(parsed)
        read_src = gen.reader(parsed)
    except Unsupported:
        return None
    except Exception:  # a schema shape the generator did not foresee: fastavro handles it
        return None
    namespace = {**_GLOBALS, **gen.constants}
    exec(compile(write_src + "\n" + read_src, "<avro codec>", "exec"), namespace)
    return Compiled(write=namespace["write"], read=namespace["read"])


def _varint(target: str, reader: str = "_read_long") -> list[str]:
    """Lines that read a zig-zag varint at ``p`` into ``target`` (one-byte values inline, the
    others through ``reader``: ``_read_long``, or ``_read_int`` for a 32-bit int)."""
    return [
        "c = buf[p]",
        "if c < 128:",
        f"    {target} = (c >> 1) ^ -(c & 1)",
        "    p += 1",
        "else:",
        f"    {target}, p = {reader}(buf, p)",
    ]


_SIZED = "a(_SMALL[n + 64] if n < 64 else _long(n))"
# Straight-line code per primitive: {v} is the value to write, {r} the variable to read into,
# {t} a scratch variable.
_WRITE_PRIMITIVE: dict[str, list[str]] = {
    "null": ["if {v} is not None: raise TypeError('expected null')"],
    "boolean": ["a(b'\\x01' if {v} else b'\\x00')"],
    "int": ["a(_SMALL[{v} + 64] if -64 <= {v} < 64 else _int({v}))"],
    "long": ["a(_SMALL[{v} + 64] if -64 <= {v} < 64 else _long({v}))"],
    "float": ["a(_pack_f({v}))"],
    "double": ["a(_pack_d({v}))"],
    "string": ["{t} = {v}.encode()", "n = len({t})", _SIZED, "a({t})"],
    "bytes": [
        "if isinstance({v}, str): raise TypeError('expected bytes, got str')",
        "n = len({v})",
        _SIZED,
        "a({v})",
    ],
}
_SIZED_READ = ["e = p + {t}", "if {t} < 0 or e > size: raise _bad_size({t}, p, size)"]
_READ_PRIMITIVE: dict[str, list[str]] = {
    "null": ["{r} = None"],
    # Like fastavro, any non-zero byte is true.
    "boolean": ["{r} = buf[p] != 0", "p += 1"],
    "int": _varint("{r}", "_read_int"),
    "long": _varint("{r}"),
    "float": ["{r} = _unpack_f(buf, p)[0]", "p += 4"],
    "double": ["{r} = _unpack_d(buf, p)[0]", "p += 8"],
    "string": [*_varint("{t}"), *_SIZED_READ, "{r} = buf[p:e].decode()", "p = e"],
    "bytes": [*_varint("{t}"), *_SIZED_READ, "{r} = buf[p:e]", "p = e"],
}


class _Generator:
    """Emits the source of ``write(v, out)`` and ``read(buf, p)`` for one schema."""

    def __init__(self, named: Mapping[str, Any]) -> None:
        self.named = named
        self.constants: dict[str, Any] = {}
        self.counter = 0
        self.lines: list[str] = []
        self.stack: list[str] = []

    def var(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, value: Any) -> str:
        name = self.var("_k")
        self.constants[name] = value
        return name

    def emit(self, depth: int, *lines: str, **names: str) -> None:
        """Appends ``lines`` indented; with ``names``, lines are templates to fill in."""
        indent = "    " * depth
        self.lines.extend(indent + (line.format(**names) if names else line) for line in lines)

    def resolve(self, schema: Any) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            if schema not in self.named:
                raise Unsupported(f"unknown named type {schema}")
            schema = self.named[schema]
        if isinstance(schema, dict):
            if "logicalType" in schema:  # on a primitive or a named type (a decimal's fixed)
                raise Unsupported("logical types are left to fastavro")
            if schema.get("type") in _PRIMITIVES:
                return schema["type"]
        return schema

    def enter(self, schema: Any) -> None:
        name = schema.get("name") if isinstance(schema, dict) else None
        if name is not None and name in self.stack:
            raise Unsupported(f"recursive type {name}")
        self.stack.append(name or "")

    @staticmethod
    def kind(schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        return str(schema if isinstance(schema, str) else schema.get("type"))

    # -- writer ------------------------------------------------------------------------------

    def writer(self, schema: Any) -> str:
        self.lines = ["def write(v, out):", "    a = out.append"]
        self.write(schema, "v", 1)
        return "\n".join(self.lines)

    def write(self, schema: Any, v: str, d: int) -> None:
        schema = self.resolve(schema)
        kind = self.kind(schema)
        if kind in _WRITE_PRIMITIVE:
            self.emit(d, *_WRITE_PRIMITIVE[kind], v=v, t=self.var("t"))
            return
        method = getattr(self, f"write_{kind}", None)
        if method is None:
            raise Unsupported(f"type {kind!r}")
        self.enter(schema)
        method(schema, v, d)
        self.stack.pop()

    def write_enum(self, schema: Mapping[str, Any], v: str, d: int) -> None:
        table = self.const({s: encode_long(i) for i, s in enumerate(schema["symbols"])})
        self.emit(d, f"a({table}[{v}])")

    def write_fixed(self, schema: Mapping[str, Any], v: str, d: int) -> None:
        size = int(schema["size"])
        self.emit(d, f"if len({v}) != {size}: raise ValueError('fixed size is {size}')", f"a({v})")

    def write_array(self, schema: Mapping[str, Any], v: str, d: int) -> None:
        item = self.var("x")
        self.emit(d, f"if {v}:", f"    a(_long(len({v})))", f"    for {item} in {v}:")
        self.write(schema["items"], item, d + 2)
        self.emit(d, "a(b'\\x00')")

    def write_map(self, schema: Mapping[str, Any], v: str, d: int) -> None:
        key, item = self.var("k"), self.var("x")
        self.emit(
            d, f"if {v}:", f"    a(_long(len({v})))", f"    for {key}, {item} in {v}.items():"
        )
        self.write("string", key, d + 2)
        self.write(schema["values"], item, d + 2)
        self.emit(d, "a(b'\\x00')")

    def write_record(self, schema: Mapping[str, Any], v: str, d: int) -> None:
        for field in schema["fields"]:
            value, name = self.var("f"), repr(field["name"])
            if "default" in field:
                default = self.const(python_default(field))
                self.emit(d, f"{value} = {v}.get({name}, {default})")
            else:
                self.emit(d, f"{value} = {v}[{name}]")
            self.write(field["type"], value, d)

    write_error = write_record

    def write_union(self, branches: list[Any], v: str, d: int) -> None:
        index = _nullable_branch(branches)
        if len(branches) == 1:
            self.emit(d, "a(b'\\x00')")
            self.write(branches[0], v, d)
            return
        self.emit(d, f"if {v} is None:", f"    a({encode_long(1 - index)!r})", "else:")
        self.emit(d + 1, f"a({encode_long(index)!r})")
        self.write(branches[index], v, d + 1)

    # -- reader ------------------------------------------------------------------------------

    def reader(self, schema: Any) -> str:
        self.lines = ["def read(buf, p):", "    size = len(buf)"]
        result = self.read(schema, 1)
        self.emit(1, f"return {result}, p")
        return "\n".join(self.lines)

    def read(self, schema: Any, d: int) -> str:
        """Emits code that reads a value at ``p``; returns the variable holding it."""
        schema = self.resolve(schema)
        kind = self.kind(schema)
        out = self.var("r")
        if kind in _READ_PRIMITIVE:
            self.emit(d, *_READ_PRIMITIVE[kind], r=out, t=self.var("t"))
            return out
        method = getattr(self, f"read_{kind}", None)
        if method is None:
            raise Unsupported(f"type {kind!r}")
        self.enter(schema)
        method(schema, out, d)
        self.stack.pop()
        return out

    def read_enum(self, schema: Mapping[str, Any], out: str, d: int) -> None:
        symbols, i = self.const(tuple(schema["symbols"])), self.var("i")
        self.emit(d, *_varint(i))
        count = len(schema["symbols"])
        self.emit(d, f"if not 0 <= {i} < {count}: raise _bad_index('enum', {i})")
        self.emit(d, f"{out} = {symbols}[{i}]")

    def read_fixed(self, schema: Mapping[str, Any], out: str, d: int) -> None:
        size = int(schema["size"])
        self.emit(d, f"if p + {size} > size: raise _eof({size}, p, size)")
        self.emit(d, f"{out} = buf[p:p + {size}]", f"p += {size}")

    def read_array(self, schema: Mapping[str, Any], out: str, d: int) -> None:
        self.emit(d, f"{out} = []")
        self.read_blocks(schema["items"], d, lambda value: f"{out}.append({value})")

    def read_map(self, schema: Mapping[str, Any], out: str, d: int) -> None:
        self.emit(d, f"{out} = {{}}")
        key = self.var("key")

        def store(value: str) -> str:
            return f"{out}[{key}] = {value}"

        self.read_blocks(schema["values"], d, store, key=key)

    def read_blocks(
        self, item: Any, d: int, store: Callable[[str], str], key: str | None = None
    ) -> None:
        """Arrays and maps: blocks of ``count`` items (a negative count is followed by a size)."""
        if _may_be_empty(self.resolve(item), self):
            raise Unsupported("items that take no bytes")
        count = self.var("c")
        self.emit(d, "while True:")
        self.emit(d + 1, *_varint(count))
        self.emit(d + 1, f"if {count} == 0: break", f"if {count} < 0:", f"    {count} = -{count}")
        self.emit(d + 2, *_varint(self.var("b")))  # the block's size in bytes: unused
        self.emit(d + 1, f"for _ in range({count}):")
        if key is not None:
            self.emit(d + 2, f"{key} = {self.read('string', d + 2)}")
        value = self.read(item, d + 2)
        self.emit(d + 2, store(value))

    def read_record(self, schema: Mapping[str, Any], out: str, d: int) -> None:
        values = [(f["name"], self.read(f["type"], d)) for f in schema["fields"]]
        self.emit(d, f"{out} = {{{', '.join(f'{n!r}: {v}' for n, v in values)}}}")

    read_error = read_record

    def read_union(self, branches: list[Any], out: str, d: int) -> None:
        index, i = _nullable_branch(branches), self.var("i")
        self.emit(d, *_varint(i))
        self.emit(d, f"if {i} == {index}:")
        self.emit(d + 1, f"{out} = {self.read(branches[index], d + 1)}")
        if len(branches) == 2:
            self.emit(d, f"elif {i} == {1 - index}:", f"    {out} = None")
        self.emit(d, f"else: raise _bad_index('union', {i})")


def _nullable_branch(branches: list[Any]) -> int:
    """The index of the one non-null branch of ``[null, T]``, ``[T, null]`` or ``[T]``."""
    other = [i for i, b in enumerate(branches) if b != "null"]
    if len(other) != 1 or len(branches) > 2:
        raise Unsupported("unions other than null + one type")
    return other[0]


def _may_be_empty(schema: Any, gen: _Generator) -> bool:
    """Whether a value of ``schema`` can take zero bytes (then a count bounds nothing)."""
    if schema == "null":
        return True
    if isinstance(schema, dict):
        if schema.get("type") == "fixed":
            return int(schema["size"]) == 0
        if schema.get("type") in ("record", "error"):
            return all(_may_be_empty(gen.resolve(f["type"]), gen) for f in schema["fields"])
    return False


def python_default(field: Mapping[str, Any]) -> Any:
    """A field's default as a writer value (JSON defaults of bytes are ISO-8859-1 text)."""
    default = field["default"]
    kind = field["type"]
    if isinstance(kind, list) and kind:  # a union's default is of its first branch
        kind = kind[0]
    kind = kind.get("type") if isinstance(kind, Mapping) else kind
    if kind in ("bytes", "fixed") and isinstance(default, str):
        return default.encode("iso-8859-1")
    return default
