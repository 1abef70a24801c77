"""What a worker writes next to each committed offset (Kafka's offset metadata). Pure.

The committed offset of a partition is its lowest unfinished offset, so offsets above it may be
finished already. The metadata lists them (``finished``, encoded by :mod:`.offsetmap`), and a new
owner skips them: after a crash only the jobs that had not finished run again (and those that
finished after the last commit). A job that was *moved* (retried or dead-lettered) must never be
moved twice, so the offsets moved above the commit point are also listed on their own
(``moved``), in the same transaction as the moves: the finished map may be cut short to fit
(those jobs then run again), the moved list never is.

The metadata also carries what poison-pill detection needs (see :mod:`..recovery.poison`):
whether an owner was running the partition (``dirty``: a new owner that finds it set knows its
predecessor died without a clean hand-over), a promise that no offset at or above ``high`` was
handed to a handler, how many times the job at the commit point ran alone and killed its worker
(``strikes``), and which offsets were running together during a quarantine (``window``).

Kafka bounds metadata (``offset.metadata.max.bytes``, 4096 by default; the worker's
``offset_metadata_max_bytes`` says what the cluster allows). :func:`max_moved` bounds the moved
offsets a partition may hold above its commit point so that their list always fits; :func:`fit`
cuts the finished map short where the whole would not.

The envelope is JSON with ``"v": 1``. Fields are only ever added (``f``, the finished map, came
after the first release; ``o``, the offset the mark was written for, later still): a reader
ignores keys it does not know, so a worker of either side of a rolling upgrade reads the other's
marks (an older one skips only the moved offsets). The version changes only with a change an
older reader would misread.

Every other field is relative to the committed offset. A tool that moves a group's committed
offset and keeps its metadata (MirrorMaker 2's offset sync does) would shift the skips, moves
and strikes onto other messages, so a mark whose ``o`` is not the offset it is read with counts
as empty: everything from the committed offset runs. A mark without ``o`` (written by a worker
of an earlier release) is read as before. Metadata that is not a mark, whatever it holds, reads
as an empty mark too: reading it never raises.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from . import offsetmap
from .offsetmap import Runs

METADATA_MAX_BYTES = 4096
"""Kafka's default ``offset.metadata.max.bytes``."""
MAX_MOVED = METADATA_MAX_BYTES // 16
"""Moved offsets above a partition's commit point at most, with the default metadata limit."""
_PREFIX = '{"v":1'
"""How every mark begins (:meth:`CommitMark.encode` writes ``v`` first): other metadata is not
parsed at all."""


def max_moved(limit: int) -> int:
    """Moved offsets a partition may hold above its commit point with a metadata ``limit`` of
    that many bytes; more moves wait for it to advance. A moved offset costs at most about 9
    bytes of the list (a delta and a comma), so the list takes at most about half the limit;
    the rest of the envelope (the offset, the promise, the flags: at most about 120 bytes)
    fits in the other half of the smallest limit allowed (1,024 bytes)."""
    return limit // 16


@dataclass(frozen=True, slots=True)
class CommitMark:
    """The metadata of one committed offset ``offset``."""

    offset: int
    moved: tuple[int, ...] = ()
    """Offsets above ``offset`` already moved by a committed transaction, increasing."""
    dirty: bool = False
    """Written by a running owner; False on its last commit before a clean hand-over."""
    high: int = -1
    """No offset at or above it was handed to a handler (-1: no promise made)."""
    strikes: int = 0
    """Times the message at ``offset`` ran alone on the partition and killed its worker."""
    window: int = -1
    """During a quarantine, offsets from ``offset`` up to this one ran together (or were left
    to run alone after such a group died): the next owner runs them one at a time."""
    finished: Runs = ()
    """Offsets at or above ``offset`` that are finished (moved ones included), as far as they
    fit; a new owner skips them."""

    @property
    def skips(self) -> Runs:
        """Every offset a new owner must not run again: finished or moved."""
        if not self.moved:
            return self.finished
        return offsetmap.merge(self.finished, offsetmap.runs_of(self.moved))

    def encode(self) -> str:
        record: dict[str, object] = {"v": 1, "o": self.offset}
        if self.moved:
            deltas, previous = [], self.offset
            for offset in self.moved:
                deltas.append(offset - previous)
                previous = offset
            record["m"] = deltas
        if self.dirty:
            record["d"] = 1
        if self.high >= 0:
            record["h"] = self.high - self.offset
        if self.strikes:
            record["s"] = self.strikes
        if self.window > self.offset:
            record["w"] = self.window - self.offset
        if self.finished:
            record["f"] = offsetmap.encode(self.offset, self.finished)
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def decode(cls, offset: int, metadata: str | None) -> CommitMark:
        """The mark committed with ``offset``; an empty one for metadata we did not write, or
        wrote for another offset (see the module docstring)."""
        record = _record(offset, metadata)
        if record is None:
            return cls(offset)
        try:
            moved, current = [], offset
            for delta in record.get("m", ()):
                current += int(delta)
                moved.append(current)
            high = record.get("h")
            window = record.get("w")
            finished = record.get("f", "")
            if not isinstance(finished, str):
                return cls(offset)
            return cls(
                offset,
                tuple(moved),
                bool(record.get("d")),
                offset + int(high) if high is not None else -1,
                int(record.get("s", 0)),
                offset + int(window) if window is not None else -1,
                offsetmap.decode(offset, finished),
            )
        except (ValueError, TypeError, OverflowError):  # OverflowError: int() of infinity
            return cls(offset)


def promised(offset: int, metadata: str) -> int:
    """The ``high`` of the mark ``metadata`` of ``offset``, without decoding its map (read at
    every acknowledged commit)."""
    record = _record(offset, metadata)
    try:
        if record is not None and record.get("h") is not None:
            return offset + int(record["h"])
    except (ValueError, TypeError, OverflowError):
        pass
    return -1


def _record(offset: int, metadata: str | None) -> dict[str, Any] | None:
    """The JSON object of the mark ``metadata`` of ``offset``; None for anything else: not a
    mark, not readable (nested too deep for the parser, say), or written for another offset."""
    if not metadata or not metadata.startswith(_PREFIX):
        return None
    try:
        record = json.loads(metadata)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("v") != 1:
        return None
    base = record.get("o")
    if base is not None and (type(base) is not int or base != offset):
        return None  # written for another offset: its deltas would land on other messages
    return record


def fit(mark: CommitMark, limit: int) -> tuple[str, bool]:
    """``mark`` encoded in at most ``limit`` bytes, and whether it is whole.

    Where the whole does not fit, the finished map is cut at the highest offset that lets it
    (the jobs above the cut run again after a crash; moved offsets stay listed). A mark that
    does not fit even without its map goes without it all the same: Kafka refuses that
    commit, and a later one, once the commit point has passed some of the moves, fits.
    """
    whole = _encoded(mark)
    if whole is not None and len(whole) <= limit:
        return whole, True
    best = replace(mark, finished=()).encode()
    if len(best) > limit:
        return best, False
    low, high = mark.offset, mark.finished[-1][1]  # keep the finished offsets below the cut
    while low < high:
        cut = (low + high + 1) // 2
        text = _encoded(replace(mark, finished=offsetmap.clip(mark.finished, mark.offset, cut)))
        if text is not None and len(text) <= limit:
            best, low = text, cut
        else:
            high = cut - 1
    return best, False


def _encoded(mark: CommitMark) -> str | None:
    try:
        return mark.encode()
    except ValueError:  # a map too large for any form
        return None
