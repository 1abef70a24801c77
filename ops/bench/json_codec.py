"""JSON payloads: the json module, orjson and msgspec, and what ``JsonPayload`` does now.

``python -m ops.bench.json_codec [--rounds 3] [--loops 50000]`` prints a Markdown table. No
Kafka: this times one encode and one decode of realistic payloads in this process. Every
candidate runs once per round, interleaved, on each payload; the table shows the median of the
rounds in nanoseconds per call and each one's speed next to the json module's. "json module"
is the encoding ``JsonPayload`` used before it took msgspec (it is still its fallback, so it
stays callable here); orjson is measured when it is installed (``pip install orjson``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from pipeline import JsonPayload
from pipeline._jsonpayload import _decode_with_json, _encode_with_json

PAYLOADS: dict[str, dict[str, Any]] = {
    "tiny `{n}`": {"n": 12345},
    "flat str/int": {
        "to": "ada@example.com",
        "subject": "Your invoice 2026-11",
        "user_id": 981234,
        "retries": 3,
        "locale": "en",
    },
    "unicode": {"name": "Zoë Ωmega 名前", "city": "Kraków", "emoji": "🚀✨", "n": 7},
    "nested": {
        "order": {
            "id": "o-1",
            "lines": [
                {"sku": "a", "qty": 2, "price": 9.5},
                {"sku": "b", "qty": 1, "price": 12.25},
            ],
        },
        "tags": ["x", "y"],
        "ok": True,
        "note": None,
    },
}

Call = Callable[[Any], object]


def _candidates() -> dict[str, tuple[Call, Call]]:
    """Name -> (encode a dict, decode bytes)."""
    codec = JsonPayload()
    found: dict[str, tuple[Call, Call]] = {
        "json module (before)": (
            lambda p: _encode_with_json("t", p),
            lambda b: _decode_with_json("t", b),
        ),
        "msgspec, raw": (msgspec.json.Encoder().encode, msgspec.json.Decoder().decode),
        "JsonPayload (now: msgspec where exact)": (
            lambda p: codec.encode("t", p),
            lambda b: codec.decode("t", b),
        ),
    }
    try:
        import orjson
    except ImportError:
        return found
    found["orjson, raw"] = (orjson.dumps, orjson.loads)
    return found


def _time(call: Call, arg: object, loops: int) -> float:
    began = time.perf_counter()
    for _ in range(loops):
        call(arg)
    return (time.perf_counter() - began) / loops * 1e9


def measure(rounds: int, loops: int) -> list[str]:
    candidates = _candidates()
    table = [
        "| payload | bytes | operation | " + " | ".join(candidates) + " |",
        "|---|---:|---|" + "---:|" * len(candidates),
    ]
    for label, payload in PAYLOADS.items():
        data = _encode_with_json("t", payload)
        for operation, index, arg in (("encode", 0, payload), ("decode", 1, data)):
            samples: dict[str, list[float]] = {name: [] for name in candidates}
            for _ in range(rounds):
                for name, calls in candidates.items():
                    samples[name].append(_time(calls[index], arg, loops))
            medians = {name: statistics.median(values) for name, values in samples.items()}
            base = medians["json module (before)"]
            cells = [
                f"{ns:,.0f} ns" + ("" if name.startswith("json") else f" ({base / ns:.1f}x)")
                for name, ns in medians.items()
            ]
            table.append(f"| {label} | {len(data)} | {operation} | " + " | ".join(cells) + " |")
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.json_codec")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loops", type=int, default=50_000)
    args = parser.parse_args(argv)
    json.dumps({})  # import-time work out of the first sample
    print("\n".join(measure(args.rounds, args.loops)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
