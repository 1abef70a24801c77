"""JsonPayload uses msgspec where that is exact, and agrees with the json module everywhere."""

from __future__ import annotations

import enum
import json
import math
import sys
import uuid
from datetime import date
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pipeline._jsonpayload as jsonpayload
from pipeline import DecodeError, JsonPayload, PayloadValidationError

CODEC = JsonPayload()

# Every kind of value the json module reads or writes, with the awkward corners weighted in:
# floats of every magnitude (exponent notation), non-finite floats, integers past 64 bits,
# lone surrogates, control characters, tuples, non-string keys below the top level.
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64 + 2)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e16, 1e-4, 9.99e-5, 1e-7, 5e-324, -0.0, 1.2345678901234568e17])
    | st.text()
    | st.sampled_from(["\ud800", "\x00\x1f\x7f", "\u2028é名🚀", '"\\/'])
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        | st.dictionaries(st.integers() | st.booleans() | st.none(), inner, max_size=2)
    ),
    max_leaves=12,
)
_payloads = st.dictionaries(st.text(max_size=8), _values, max_size=6)


def _json_bytes(payload: dict[str, Any]) -> bytes | None:
    """What the json module writes for ``payload``; None when it refuses it."""
    try:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError):
        return None


@given(_payloads)
def test_encode_writes_the_json_modules_bytes_and_refuses_what_it_refuses(
    payload: dict[str, Any],
) -> None:
    expected = _json_bytes(payload)
    if expected is None:
        with pytest.raises(PayloadValidationError):
            CODEC.encode("t", payload)
    else:
        assert CODEC.encode("t", payload) == expected


@given(_payloads)
def test_decode_reads_what_json_loads_reads(payload: dict[str, Any]) -> None:
    # allow_nan: the json module reads NaN and Infinity, so the decoder must read them too.
    try:
        data = json.dumps(payload, ensure_ascii=False, allow_nan=True).encode("utf-8")
    except UnicodeEncodeError:
        data = json.dumps(payload, ensure_ascii=True, allow_nan=True).encode("ascii")
    decoded = CODEC.decode("t", data)
    expected = json.loads(data)
    assert repr(decoded) == repr(expected)  # repr: NaN != NaN, and 1 == 1.0 == True
    assert _types(decoded) == _types(expected)


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _types(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_types(item) for item in value]
    return type(value).__name__


class Colour(enum.Enum):
    RED = "red"


@pytest.mark.parametrize(
    "value",
    [uuid.UUID(int=1), date(2026, 1, 1), b"raw", {1, 2}, Colour.RED, math.nan, -math.inf],
)
def test_what_msgspec_would_write_but_json_refuses_is_refused_naming_the_field(
    value: object,
) -> None:
    with pytest.raises(PayloadValidationError, match=r"field 'deep\.x\[0\]'") as info:
        CODEC.encode("report.build", {"deep": {"x": [value]}})
    assert info.value.job_type == "report.build"


def test_plain_payloads_are_written_and_read_without_the_json_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*_args: object) -> Any:
        raise AssertionError("the json module was used for a plain payload")

    monkeypatch.setattr(jsonpayload, "_encode_with_json", refuse)
    monkeypatch.setattr(jsonpayload, "_decode_with_json", refuse)
    payload = {"to": "zoë@example.com", "n": 2**70, "x": [1.5, None, True, {"k": "名"}]}
    data = CODEC.encode("t", payload)
    expected = '{"to":"zoë@example.com","n":1180591620717411303424,"x":[1.5,null,true,{"k":"名"}]}'
    assert data == expected.encode()
    assert CODEC.decode("t", data) == payload


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"a":NaN}', "{'a': nan}"),
        (b'{"a":1e400}', "{'a': inf}"),
        (b'{"a":"\\ud800"}', "{'a': '\\ud800'}"),
        (b'{"a":18446744073709551616}', "{'a': 18446744073709551616}"),
    ],
)
def test_decode_reads_what_only_the_json_module_reads(data: bytes, expected: str) -> None:
    assert repr(CODEC.decode("t", data)) == expected


def test_decode_of_a_memoryview_keeps_the_raw_bytes_in_the_error() -> None:
    with pytest.raises(DecodeError, match="not UTF-8 JSON") as info:
        CODEC.decode("t", memoryview(b'{"a":'))  # type: ignore[arg-type]
    assert info.value.raw == b'{"a":'


def test_a_payload_nested_too_deeply_is_a_decode_error_not_a_crash() -> None:
    # json.loads raises RecursionError here: a worker would have let it escape its batch.
    depth = 2 * sys.getrecursionlimit()  # some test tools raise the limit for a while
    deep = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(DecodeError, match="nested too deeply") as raised:
        CODEC.decode("t", deep)
    assert raised.value.raw == deep


def test_encoding_a_payload_nested_too_deeply_is_a_validation_error() -> None:
    value: list[Any] = []
    for _ in range(2 * sys.getrecursionlimit()):
        value = [value]
    with pytest.raises(PayloadValidationError, match="nested too deeply"):
        CODEC.encode("t", {"a": value})
