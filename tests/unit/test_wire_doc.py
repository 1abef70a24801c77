"""docs/wire-format.md against the code: its golden hex, and block-encoded maps and arrays.

Avro lets a writer put a map or array as blocks of a negative count followed by the block's
byte size (hamba/avro does so); the worker's codec must read those as the same job.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline._avro import SchemaStore
from pipeline._codec import JobCodec

from .test_codec import GOLDEN_JOB, GOLDEN_JOB_HEX

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire-format.md"


def test_the_docs_golden_hex_is_the_codec_tests_golden_hex() -> None:
    text = DOC.read_text(encoding="utf-8")
    [block] = re.findall(r"<!-- golden-hex -->\n```\n(.*?)```", text, re.S)
    assert "".join(block.split()) == GOLDEN_JOB_HEX


def test_maps_and_arrays_in_blocks_with_a_byte_size_decode_to_the_same_job() -> None:
    golden = bytes.fromhex(GOLDEN_JOB_HEX)
    headers = bytes.fromhex("020c736f757263650c7369676e757000")
    entries = headers[1:-1]
    # A block of count -1 (zig-zag 0x01) and its byte size (zig-zag 2n) before its entries.
    assert len(entries) < 64
    sized_headers = bytes([0x01, 2 * len(entries)]) + entries + b"\x00"
    start = golden.index(headers)
    errors = golden[start + len(headers) :]
    item = errors[1:-1]
    sized_errors = bytes([0x01, 2 * len(item)]) + item + b"\x00"
    blocks = golden[:start] + sized_headers + sized_errors
    assert blocks != golden
    assert JobCodec().decode(blocks) == GOLDEN_JOB


def test_the_docs_go_is_the_interop_producers_code() -> None:
    """Every Go block of the page is a piece of the producer the interop test runs (its main or
    its envelope package), verbatim."""
    text = DOC.read_text(encoding="utf-8")
    module = DOC.parents[1] / "tests" / "interop" / "go"
    code = "".join(path.read_text(encoding="utf-8") for path in sorted(module.rglob("*.go")))
    blocks = re.findall(r"```go\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    for block in blocks:
        assert block in code, f"docs/wire-format.md has Go that the producer does not:\n{block}"


def test_the_docs_header_table_names_every_released_version_with_its_header() -> None:
    """A reader in another language checks the constant header of each version it reads: the
    page lists them all (dead letters are written as v2), each as the store computes it."""
    text = DOC.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(pipeline\.\w+)` v(\d+) \| `((?:[0-9a-f]{2} ?){10})`", text, re.M)
    documented = {(name, int(version)): bytes.fromhex(header) for name, version, header in rows}
    released = {(s.full_name, s.version): s.header for s in SchemaStore()}
    assert documented == released
