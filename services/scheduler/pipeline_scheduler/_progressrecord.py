"""The progress record of a source partition on ``<ns>.scheduler-state``: its format. Pure.

A record holds the watermark ``w``, the position ``p`` and the held offsets between them, as
runs of consecutive offsets (a gap, then a length; see :mod:`._progress` for what they mean to
a new leader). Any writer can put anything on the topic, so :meth:`SavedProgress.decode`
checks a record before it trusts it, with memory bounded by :data:`MAX_HELD` offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

__all__ = ["MAX_HELD", "MAX_OFFSET", "BadProgressError", "SavedProgress", "extend_runs", "runs_of"]

MAX_OFFSET = 2**63 - 1
"""Kafka's offsets are signed 64-bit integers."""
MAX_HELD = 2_000_000
"""Most held offsets a record may name (about 150 MB once expanded); a record naming more is
treated as bad. The leader holds at most this many jobs of one partition (a gigabyte or more of
memory), so that its own records always read back."""


class BadProgressError(ValueError):
    """A progress record that is not one the scheduler wrote (see :meth:`SavedProgress.decode`)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"not a progress record: {reason}")


def _offset(value: Any, what: str, low: int = 0) -> int:
    # bool is an int to Python, and json reads 1e400 as a float (infinity): neither is an offset.
    if type(value) is not int or not low <= value <= MAX_OFFSET:
        raise BadProgressError(f"{what} is not an offset: {str(value)[:40]}")
    return value


def runs_of(offsets: Iterable[int]) -> list[int]:
    """The runs of consecutive offsets of ``offsets`` (ascending, no repeats), flat: the first
    offset of each run and one past its last. One loop, no call per offset: a commit of a
    partition holding a million offsets makes them."""
    runs: list[int] = []
    start = end = -1
    for offset in offsets:
        if offset != end:
            if end >= 0:
                runs += (start, end)
            start = offset
        end = offset + 1
    if end >= 0:
        runs += (start, end)
    return runs


def extend_runs(runs: list[int], start: int, end: int) -> None:
    """Add the offsets from ``start`` to before ``end`` to ``runs``, none of them below the
    last run's start: to the last run if they touch it (or repeat some of its offsets)."""
    if runs and runs[-1] >= start:
        runs[-1] = max(runs[-1], end)
    else:
        runs += (start, end)


@dataclass(frozen=True, slots=True)
class SavedProgress:
    """What one committed transaction recorded about a partition: its watermark, its position
    and the offsets held between them, as runs (what a record's size grows with, and what
    writing one costs: a leader replaying a record of a million held offsets writes a record
    at every commit, without expanding them)."""

    watermark: int
    position: int
    runs: tuple[int, ...] = field(default=(), kw_only=True)
    """The runs of consecutive held offsets in offset order, flat: the first offset of each and
    one past its last (``(3, 5, 8, 9)`` holds 3, 4 and 8); adjacent runs are one."""

    @classmethod
    def holding(cls, watermark: int, position: int, held: Iterable[int]) -> SavedProgress:
        """The record that holds the offsets ``held`` (in any order)."""
        return cls(watermark, position, runs=tuple(runs_of(sorted(set(held)))))

    @property
    def held(self) -> tuple[int, ...]:
        """Every held offset, in order (expanded: a new leader's, once)."""
        runs = self.runs
        return tuple(chain.from_iterable(map(range, runs[::2], runs[1::2])))

    def encode(self) -> bytes:
        """Version 2: ``r`` holds, for each run of consecutive held offsets, its distance from
        the end of the one before (from the watermark for the first) and its length."""
        runs = self.runs
        record_runs: list[int] = []
        end = self.watermark  # one past the previous run
        for start, stop in zip(runs[::2], runs[1::2], strict=True):
            record_runs += (start - end, stop - start)
            end = stop
        record = {"v": 2, "w": self.watermark, "p": self.position, "r": record_runs}
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, max_held: int = MAX_HELD) -> SavedProgress:
        """Read a record of either version; :class:`BadProgressError` (a ``ValueError``) for
        anything else, whatever it holds, with at most ``max_held`` offsets (the writer's bound,
        :class:`PartitionProgress`'s ``max_held``: they are expanded on a takeover)."""
        try:
            record = json.loads(data)
            if not isinstance(record, dict):
                raise BadProgressError(f"a JSON {type(record).__name__}, not an object")
            raw_runs = record.get("r")
            deltas = record["h"] if raw_runs is None else None
            watermark = _offset(record["w"], "w")
            position = _offset(record["p"], "p", watermark)
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            if isinstance(exc, BadProgressError):
                raise
            raise BadProgressError(type(exc).__name__) from exc
        runs: list[int] = []
        count = 0
        if raw_runs is not None:
            if type(raw_runs) is not list or len(raw_runs) % 2:
                raise BadProgressError("r is not a list of (gap, length) pairs")
            end = watermark
            for i in range(0, len(raw_runs), 2):
                start = end + _offset(raw_runs[i], "a gap")
                end = start + _offset(raw_runs[i + 1], "a run length", 1)
                count += end - start
                cls._check_held(count, end, position, max_held)
                extend_runs(runs, start, end)  # after a gap of 0: the same run
        else:  # version 1: each held offset's distance from the one before
            if type(deltas) is not list:
                raise BadProgressError("h is not a list of offsets")
            offset = watermark
            for delta in deltas:
                offset += _offset(delta, "a held offset's distance")
                count += 1
                cls._check_held(count, offset + 1, position, max_held)
                extend_runs(runs, offset, offset + 1)
        return cls(watermark, position, runs=tuple(runs))

    @staticmethod
    def _check_held(count: int, end: int, position: int, max_held: int) -> None:
        """Checked before each run is expanded: ``count`` held so far, the last below ``end``."""
        if end > position:
            raise BadProgressError(f"a held offset ({end - 1}) is not below the position")
        if count > max_held:
            raise BadProgressError(f"more than {max_held} held offsets")
