"""What a worker writes next to each committed offset (Kafka's offset metadata). Pure.

The committed offset of a partition is its lowest unfinished offset, so offsets above it may be
finished already. For most jobs that only means a repeat after a crash (at-least-once). A job
that was *moved* (retried or dead-lettered) must not be moved twice, so the offsets moved above
the commit point travel in the commit's metadata, in the same transaction as the moves; a new
owner skips them.

The metadata also carries what poison-pill detection needs (see :mod:`..recovery.poison`):
whether an owner was running the partition (``dirty``: a new owner that finds it set knows its
predecessor died without a clean hand-over), a promise that no offset at or above ``high`` was
handed to a handler, how many times the job at the commit point ran alone and killed its worker
(``strikes``), and which offsets were running together during a quarantine (``window``).

Kafka bounds metadata (``offset.metadata.max.bytes``, 4096 by default); :data:`MAX_MOVED`
bounds the moved offsets a partition may hold above its commit point so that a mark always fits.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_MOVED = 256
"""Moved offsets above a partition's commit point at most; more moves wait for it to advance."""


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

    def encode(self) -> str:
        record: dict[str, object] = {"v": 1}
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
        return json.dumps(record, separators=(",", ":"))

    @classmethod
    def decode(cls, offset: int, metadata: str | None) -> CommitMark:
        """The mark committed with ``offset``; an empty one for metadata we did not write."""
        if not metadata:
            return cls(offset)
        try:
            record = json.loads(metadata)
            if not isinstance(record, dict) or record.get("v") != 1:
                return cls(offset)
            moved, current = [], offset
            for delta in record.get("m", ()):
                current += int(delta)
                moved.append(current)
            high = record.get("h")
            window = record.get("w")
            return cls(
                offset,
                tuple(moved),
                bool(record.get("d")),
                offset + int(high) if high is not None else -1,
                int(record.get("s", 0)),
                offset + int(window) if window is not None else -1,
            )
        except (ValueError, TypeError):
            return cls(offset)
