"""The offsets finished above a partition's commit point, as the runs its next mark lists."""

from __future__ import annotations

import bisect
import time
from typing import TYPE_CHECKING

from . import offsetmap

if TYPE_CHECKING:
    from .._work import PartitionState

__all__ = ["MAP_COST_FACTOR", "MAP_COST_FLOOR_S", "finished_runs"]

MAP_COST_FACTOR = 19.0
"""After reading a partition's finished offsets, wait this many times as long as the reading
took before the next: at most 5% of the consumer thread goes to it."""
MAP_COST_FLOOR_S = 0.0005
"""A reading faster than this is not spaced out (the usual case: a few thousand offsets)."""


def finished_runs(
    state: PartitionState, offset: int, moved: tuple[int, ...], mapped: int
) -> offsetmap.Runs:
    """The offsets finished at or above ``offset``: by us (the loop's tracker, and ``moved``,
    whose jobs may not be finished there yet), or by a previous owner, not consumed yet.

    Reading the tracker costs time in proportion to the finished offsets it holds (tens of
    milliseconds for hundreds of thousands behind a stuck job), so a reading slower than
    :data:`MAP_COST_FLOOR_S` is followed by the next only after :data:`MAP_COST_FACTOR` times
    as long; meanwhile the runs of that reading go out again (still finished, just not the
    newest). ``mapped``: the tracker's count now.
    """
    now = time.monotonic()
    if now >= state.map_next:
        done = state.tracker.finished_above()
        state.map_runs = offsetmap.runs_of(done[bisect.bisect_left(done, offset) :])
        finished_at = time.monotonic()
        cost = finished_at - now
        state.map_next = finished_at + cost * MAP_COST_FACTOR if cost >= MAP_COST_FLOOR_S else 0.0
        state.mapped = mapped
    runs = offsetmap.clip(state.map_runs, offset)
    skips = state.skips
    if skips is None and not moved:
        return runs
    # All of them, not those the loop has not passed yet: one it passed after the reading (or
    # while it was made) is in neither.
    above = skips.above(offset) if skips is not None else ()
    return offsetmap.merge(runs, above, offsetmap.runs_of(moved))
