"""The finished offsets above a commit point, as short text for the commit's metadata. Pure.

Jobs of a partition finish in any order, so above its commit point (the lowest unfinished
offset) some offsets are finished already. They travel with each commit so that a new owner
skips them instead of running them again. Kafka bounds the metadata of a committed offset
(``offset.metadata.max.bytes``, 4096 bytes by default), so the set is encoded compactly, in
whichever of four forms is shortest for this commit:

- ``r``: run lengths, from the commit point up: unfinished, finished, unfinished, ... each an
  unsigned LEB128 varint (a long run of successes costs a few bytes);
- ``b``: a bitset, bit ``i`` (least significant first) for offset ``commit point + i``
  (scattered completions cost one bit each);
- ``R``, ``B``: the same, compressed with raw DEFLATE (regular patterns).

The bytes go out in base85 (:func:`base64.b85encode`), whose alphabet has neither ``"`` nor
``\\``, so the text sits in a JSON string unescaped. A form whose raw bytes exceed
:data:`MAX_RAW` is never written, and a reader refuses one: a corrupt or hostile mark cannot
make a worker inflate megabytes.

Sets are :data:`Runs`: increasing, disjoint, non-adjacent half-open ranges ``(start, end)``.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable

Runs = tuple[tuple[int, int], ...]
"""Offsets as increasing, disjoint, non-adjacent half-open ranges ``(start, end)``."""

MAX_RAW = 256 * 1024
"""The longest uncompressed form written or read (a bitset of about two million offsets)."""

_WBITS = -15  # raw DEFLATE: no zlib header or checksum, 6 bytes fewer


def runs_of(offsets: Iterable[int]) -> Runs:
    """The runs of increasing ``offsets`` (repeats allowed)."""
    runs: list[tuple[int, int]] = []
    start = end = -1
    for offset in offsets:
        if offset == end:
            end += 1
        elif offset > end:
            if end > start:
                runs.append((start, end))
            start, end = offset, offset + 1
    if end > start:
        runs.append((start, end))
    return tuple(runs)


def merge(*sets: Runs) -> Runs:
    """The union of ``sets``."""
    parts = sorted(run for runs in sets for run in runs)
    merged: list[tuple[int, int]] = []
    for start, end in parts:
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return tuple(merged)


def clip(runs: Runs, low: int, high: int | None = None) -> Runs:
    """The offsets of ``runs`` at or above ``low`` (and below ``high``, if given)."""
    clipped = []
    for start, end in runs:
        if high is not None and start >= high:
            break
        stop = end if high is None else min(end, high)
        if stop > low:
            clipped.append((max(start, low), stop))
    return tuple(clipped)


def count(runs: Runs) -> int:
    """How many offsets ``runs`` holds."""
    return sum(end - start for start, end in runs)


def encode(base: int, runs: Runs) -> str:
    """``runs`` (every offset at or above ``base``) in the shortest form; '' for none.

    Raises ValueError if no form fits in :data:`MAX_RAW` bytes.
    """
    if not runs:
        return ""
    if runs[0][0] < base:
        raise ValueError(f"offset {runs[0][0]} is below the base {base}")
    candidates: list[tuple[str, bytes]] = []
    lengths = _run_lengths(base, runs)
    if len(lengths) <= MAX_RAW:
        candidates.append(("r", lengths))
    if (runs[-1][1] - base + 7) // 8 <= MAX_RAW:
        candidates.append(("b", _bitset(base, runs)))
    if not candidates:
        raise ValueError(f"{len(runs)} runs over {runs[-1][1] - base} offsets: too many to encode")
    for tag, raw in list(candidates):
        packer = zlib.compressobj(9, zlib.DEFLATED, _WBITS)
        candidates.append((tag.upper(), packer.compress(raw) + packer.flush()))
    tag, data = min(candidates, key=lambda c: len(c[1]))
    return tag + base64.b85encode(data).decode("ascii")


def decode(base: int, text: str) -> Runs:
    """The runs ``text`` (written by :func:`encode` with ``base``) holds.

    Raises ValueError if ``text`` is not such a map.
    """
    if not text:
        return ()
    tag = text[0]
    data = base64.b85decode(text[1:])
    if tag in "RB":
        unpacker = zlib.decompressobj(_WBITS)
        try:
            raw = unpacker.decompress(data, MAX_RAW)
        except zlib.error as exc:
            raise ValueError(f"offset map does not inflate: {exc}") from exc
        if unpacker.unconsumed_tail or not unpacker.eof:
            raise ValueError("offset map inflates past its limit or is cut short")
        data, tag = raw, tag.lower()
    elif len(data) > MAX_RAW:
        raise ValueError("offset map longer than its limit")
    if tag == "r":
        return _from_run_lengths(base, data)
    if tag == "b":
        return _from_bitset(base, data)
    raise ValueError(f"unknown offset map form {tag!r}")


def _run_lengths(base: int, runs: Runs) -> bytes:
    out = bytearray()
    at = base
    for start, end in runs:
        _varint(out, start - at)
        _varint(out, end - start)
        at = end
    return bytes(out)


def _varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _from_run_lengths(base: int, data: bytes) -> Runs:
    values: list[int] = []
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift > 63:
                raise ValueError("run length overflows")
            continue
        values.append(value)
        value = shift = 0
    if shift or len(values) % 2:
        raise ValueError("run lengths cut short")
    runs: list[tuple[int, int]] = []
    at = base
    for gap, length in zip(values[::2], values[1::2], strict=True):
        if length == 0 or (gap == 0 and runs):
            raise ValueError("empty or adjacent run")
        start = at + gap
        at = start + length
        runs.append((start, at))
    return tuple(runs)


def _bitset(base: int, runs: Runs) -> bytes:
    bits = bytearray((runs[-1][1] - base + 7) // 8)
    for start, end in runs:
        first, last = start - base, end - base  # bits first .. last - 1
        while first < last and first % 8:
            bits[first // 8] |= 1 << (first % 8)
            first += 1
        whole = (last - first) // 8
        if whole:
            bits[first // 8 : first // 8 + whole] = b"\xff" * whole
            first += whole * 8
        while first < last:
            bits[first // 8] |= 1 << (first % 8)
            first += 1
    return bytes(bits)


def _from_bitset(base: int, data: bytes) -> Runs:
    runs: list[tuple[int, int]] = []
    start = -1  # the open run's first offset, or -1
    for index, byte in enumerate(data):
        if (byte == 0xFF and start >= 0) or (byte == 0 and start < 0):
            continue
        for bit in range(8):
            offset = base + index * 8 + bit
            if byte >> bit & 1:
                if start < 0:
                    start = offset
            elif start >= 0:
                runs.append((start, offset))
                start = -1
    if start >= 0:
        runs.append((start, base + len(data) * 8))
    return tuple(runs)


class Skips:
    """Offsets a previous owner finished: each is passed over when it is consumed.

    The loop thread asks :meth:`covers` in increasing offset order (as a partition is
    consumed), which moves a cursor; the consumer thread reads :meth:`above` for its commits.
    The runs never change.
    """

    __slots__ = ("_at", "_runs")

    def __init__(self, runs: Runs) -> None:
        self._runs = runs
        self._at = 0

    def covers(self, offset: int) -> bool:
        runs = self._runs
        at = self._at
        while at < len(runs) and runs[at][1] <= offset:
            at += 1
        self._at = at
        return at < len(runs) and runs[at][0] <= offset

    def above(self, low: int) -> Runs:
        """The offsets at or above ``low``, passed or not (a commit's mark lists every finished
        offset above its commit point)."""
        return clip(self._runs, low)
