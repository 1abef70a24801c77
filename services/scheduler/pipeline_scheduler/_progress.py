"""Progress through one source partition (``<ns>.deferred`` or a wait tier). Pure.

Jobs held in memory finish out of offset order, so the committed offset is the lowest offset
still held (the contiguous watermark) and offsets above it may already be finished. To release
none of those twice after a failover, each transaction also writes this partition's progress to
``<ns>.scheduler-state``: the watermark ``w``, the position ``p`` (every offset below it was
processed) and the held offsets ``h``. A new leader reading from ``w`` skips every offset below
``p`` that is not in ``h``: those were released or moved already, in committed transactions.
The held offsets travel as runs of consecutive offsets (a gap, then a length), so a burst of
jobs due together costs a few bytes, not a few per job (a record must stay under Kafka's message
size: half a million offsets held one by one did not).
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SavedProgress:
    """What one committed transaction recorded about a partition."""

    watermark: int
    position: int
    held: tuple[int, ...]

    def encode(self) -> bytes:
        """Version 2: ``r`` holds, for each run of consecutive held offsets, its distance from
        the end of the one before (from the watermark for the first) and its length."""
        runs: list[int] = []
        end = self.watermark  # one past the previous run
        start = previous = None
        for offset in self.held:
            if previous is not None and offset == previous + 1:
                previous = offset
                continue
            if start is not None and previous is not None:
                runs += [start - end, previous - start + 1]
                end = previous + 1
            start = previous = offset
        if start is not None and previous is not None:
            runs += [start - end, previous - start + 1]
        record = {"v": 2, "w": self.watermark, "p": self.position, "r": runs}
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> SavedProgress:
        record = json.loads(data)
        watermark = int(record["w"])
        held: list[int] = []
        if "r" in record:
            end, runs = watermark, record["r"]
            for gap, length in zip(runs[::2], runs[1::2], strict=True):
                start = end + int(gap)
                end = start + int(length)
                held.extend(range(start, end))
        else:  # version 1: each held offset's distance from the one before
            offset = watermark
            for delta in record["h"]:
                offset += int(delta)
                held.append(offset)
        return cls(watermark, int(record["p"]), tuple(held))


class PartitionProgress:
    """Held offsets, parked messages and the position of one source partition."""

    __slots__ = ("_held", "_lowest", "dirty", "parked", "position", "replay_held", "replay_until")

    def __init__(self, committed: int | None = None, saved: SavedProgress | None = None) -> None:
        self.position: int | None = committed
        self._held: set[int] = set()
        self._lowest: list[int] = []
        # Messages of a wait tier read before they may leave it; the partition is paused.
        self.parked: deque[Any] = deque()
        self.replay_until = -1
        self.replay_held: frozenset[int] = frozenset()
        if saved is not None and committed is not None and saved.watermark == committed:
            self.replay_until = saved.position
            self.replay_held = frozenset(saved.held)
        self.dirty = False

    def delivered(self, offset: int) -> None:
        """Note a message read from Kafka (before it is processed)."""
        if self.position is None:
            self.position = offset

    def finished_before(self, offset: int) -> bool:
        """Whether a committed transaction already released or moved this offset."""
        return offset < self.replay_until and offset not in self.replay_held

    def processed(self, offset: int) -> None:
        """Every offset up to ``offset`` is routed (released, moved, held or skipped)."""
        self.position = offset + 1
        self.dirty = True

    def hold(self, offset: int) -> None:
        self._held.add(offset)
        heapq.heappush(self._lowest, offset)

    def release(self, offset: int) -> None:
        self._held.discard(offset)
        self.dirty = True

    @property
    def held_count(self) -> int:
        return len(self._held)

    @property
    def watermark(self) -> int | None:
        """The offset to commit: the lowest held offset, else the position."""
        lowest = self._lowest
        held = self._held
        while lowest and lowest[0] not in held:
            heapq.heappop(lowest)
        if lowest:
            return lowest[0]
        return self.position

    def saved(self) -> SavedProgress | None:
        """The record to write with this partition's next commit (None: nothing read yet)."""
        watermark = self.watermark
        position = self.position
        if watermark is None or position is None:
            return None
        held = self._held
        if position < self.replay_until:
            # Still replaying: beyond what this term has read, the last record stands (else a
            # later term would route again what an earlier one released or moved).
            held = held | {offset for offset in self.replay_held if offset >= position}
            position = self.replay_until
        return SavedProgress(watermark, position, tuple(sorted(held)))
