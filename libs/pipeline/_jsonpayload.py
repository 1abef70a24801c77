"""The default payload codec: compact UTF-8 JSON, written and read with msgspec where that is exact.

msgspec writes and reads JSON several times faster than the json module (``ops/bench/json_codec.py``
measures both next to orjson). It is used only where it gives exactly the json module's answer;
the json module still decides, and words the error, for everything else, so the bytes on the
wire and the payloads accepted and refused are those of the json module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from ._errors import DecodeError, PayloadValidationError
from ._job import PayloadEncoding

# One encoder for every payload: json.dumps would build one per call from its keyword arguments.
_json_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_json_scan = json.JSONDecoder().raw_decode
_fast_encode = msgspec.json.Encoder().encode
_fast_decode = msgspec.json.Decoder().decode
_FAST_DECODE_ERRORS = (msgspec.DecodeError, msgspec.ValidationError)
# Floats msgspec writes as repr() does (fixed notation); outside it the json module writes
# "1e+16" where msgspec writes "1e16". NaN and infinities fail both comparisons.
_FIXED_FLOAT_MIN = 1e-4
_FIXED_FLOAT_END = 1e16


_FLAT = frozenset({str, int, bool, type(None)})


def _msgspec_exact(value: object) -> bool:
    """Whether msgspec encodes ``value`` to the json module's bytes, refusing what it refuses.

    True only for JSON's own types (exact ``str``, ``int``, ``bool``, ``None``, fixed-notation
    finite ``float``, ``list``/``tuple``, ``dict`` with ``str`` keys): msgspec also writes
    UUIDs, dates, bytes, sets, enums and NaN (as ``null``), which the json module refuses.
    """
    kind = type(value)
    if kind is dict:
        items: dict[object, object] = value  # type: ignore[assignment]
        for key, item in items.items():
            # Scalars inline: most payloads are flat dicts of strings and integers.
            if type(key) is not str or (type(item) not in _FLAT and not _msgspec_exact(item)):
                return False
        return True
    if kind is float:
        number: float = value  # type: ignore[assignment]
        return _FIXED_FLOAT_MIN <= abs(number) < _FIXED_FLOAT_END or number == 0.0
    if kind is list or kind is tuple:
        return all(map(_msgspec_exact, value))  # type: ignore[call-overload]
    return kind in _FLAT


class JsonPayload:
    """Compact UTF-8 JSON of an object with string keys (the default payload encoding).

    The bytes are those of ``json.dumps(payload, separators=(",", ":"), ensure_ascii=False,
    allow_nan=False)``; what the json module refuses (NaN, datetimes, non-string keys of the
    payload itself) is refused at enqueue, naming the field.
    """

    encoding = PayloadEncoding.JSON

    def __repr__(self) -> str:
        return "JsonPayload()"

    def encode(self, job_type: str, payload: Mapping[str, Any]) -> bytes:
        if type(payload) is dict:
            obj = payload
        elif isinstance(payload, Mapping):
            obj = dict(payload)
        else:
            raise PayloadValidationError(
                job_type, f"payload must be a mapping, got {type(payload).__name__}"
            )
        try:
            if _msgspec_exact(obj):
                return _fast_encode(obj)
        except (ValueError, RecursionError):  # a lone surrogate, a huge int, deep nesting
            pass
        return _encode_with_json(job_type, obj)

    def decode(self, job_type: str, data: bytes) -> dict[str, Any]:
        try:
            # msgspec takes a subset of what json.loads takes and reads it to the same values
            # (big integers included); it refuses NaN, Infinity, 1e400 and lone surrogate
            # escapes, which json.loads reads, so those go through the json module below.
            value = _fast_decode(data)
        except (*_FAST_DECODE_ERRORS, RecursionError):
            value = _decode_with_json(job_type, data)
        if not isinstance(value, dict):
            raise DecodeError(
                f"payload of job type {job_type!r} must be a JSON object, "
                f"got {type(value).__name__}",
                bytes(data),
            )
        return value


def _encode_with_json(job_type: str, obj: dict[str, Any]) -> bytes:
    """The json module's encoding of a payload, or the error naming the field it cannot encode."""
    for key in obj:
        if not isinstance(key, str):
            raise PayloadValidationError(job_type, f"payload key {key!r} is not a string")
    try:
        return _json_encode(obj).encode("utf-8")
    except RecursionError as exc:
        raise PayloadValidationError(job_type, "the payload is nested too deeply") from exc
    except (TypeError, ValueError) as exc:
        problem = _json_problem(obj, "") or str(exc)
        raise PayloadValidationError(job_type, problem) from exc


def _decode_with_json(job_type: str, data: bytes) -> Any:
    """What ``json.loads`` reads from ``data``, or :class:`DecodeError` with its reason."""
    try:
        text = (data if type(data) is bytes else bytes(data)).decode("utf-8")
        # The scanner alone is twice as fast as json.loads; json.loads still decides, and words
        # the error, for anything else.
        try:
            value, end = _json_scan(text)
        except ValueError:
            value, end = json.loads(text), len(text)  # leading whitespace, or the error
        if end != len(text):
            value = json.loads(text)  # trailing whitespace, or extra data: the error
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DecodeError(
            f"payload of job type {job_type!r} is not UTF-8 JSON: {exc}", bytes(data)
        ) from exc
    except RecursionError as exc:  # a worker must dead-letter it, not crash on it
        raise DecodeError(
            f"payload of job type {job_type!r} is nested too deeply to decode", bytes(data)
        ) from exc
    return value


def _json_problem(value: Any, path: str) -> str | None:
    """Where in ``value`` JSON encoding fails, as ``"field 'a.b[2]' ...: reason"``."""
    children: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int | float | bool) and key is not None:
                return f"field {path or '<payload>'!r} has a key {key!r} that is not a string"
            children.append((f"{path}.{key}" if path else str(key), item))
    elif isinstance(value, list | tuple):
        children = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
    else:
        try:
            json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            return f"field {path!r} cannot be encoded as JSON: {exc}"
    for child_path, child in children:
        found = _json_problem(child, child_path)
        if found:
            return found
    return None


def read_json(data: bytes) -> Any:
    """``data`` read as JSON, to show it; ``ValueError`` when it is not JSON, or is nested
    deeper than the json module reads (its ``RecursionError``: a payload of another producer's,
    which must not break the listing it is shown in)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep to read") from None


JSON = JsonPayload()
"""The payload codec of a job type that declares none."""
