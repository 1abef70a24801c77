"""What a replaying term's progress records copy from the record it took over. Pure.

Until a new leader's position reaches the committed record's, its records name the offsets that
record held at or above the position as they were (see :mod:`._progress`). Their bytes in a
record are measured here as the position advances, in O(1) a message, so that the leader's size
bound counts them.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence


def _digits(number: int) -> int:
    return len(str(number))


class ReplayRest:
    """The runs of a committed record's held offsets at or above a replaying term's position.

    A run entirely below the position is dropped, the one it is in is cut at it, and the runs
    above it keep their gaps and lengths. ``limit``: the record's position."""

    __slots__ = ("_after", "_ends", "_gap_digits", "_i", "_starts", "limit")

    def __init__(self, watermark: int, position: int, runs: Sequence[int]) -> None:
        """``runs``: the record's, flat (see :attr:`._progress.SavedProgress.runs`)."""
        self.limit = position
        self._starts = array("q", runs[::2])
        self._ends = array("q", runs[1::2])
        self._gap_digits = _digits(position - watermark)
        """A run's gap in a later record is from a watermark or a run end at least this one."""
        self._i = 0
        """The first run not entirely below the position."""
        self._after = sum(self._cost(i) for i in range(1, len(self._starts)))
        """The bytes of the runs after the ``_i``-th, a comma before each number."""

    def _cost(self, i: int) -> int:
        """The bytes of the ``i``-th run (not the first) and the commas before its numbers."""
        starts, ends = self._starts, self._ends
        return _digits(starts[i] - ends[i - 1]) + _digits(ends[i] - starts[i]) + 2

    def advance(self, position: int) -> None:
        """Every offset below ``position`` is routed (amortized O(1) as it advances)."""
        ends, i = self._ends, self._i
        while i < len(ends) and ends[i] <= position:
            i += 1
            if i < len(ends):
                self._after -= self._cost(i)
        self._i = i

    def bound(self, position: int) -> int:
        """The most bytes these runs take in a record after offsets held below ``position``,
        with the comma before them."""
        i = self._i
        if i == len(self._ends):
            return 0
        length = self._ends[i] - max(position, self._starts[i])
        return self._gap_digits + _digits(length) + 2 + self._after

    def runs(self, position: int) -> list[int]:
        """These runs from ``position`` on, flat, as a record names them, once every offset
        below ``position`` is routed (:meth:`advance`); in O(runs), not O(offsets)."""
        i = self._i
        if i == len(self._ends):
            return []
        runs = [0, 0] * (len(self._ends) - i)
        runs[::2] = self._starts[i:]
        runs[1::2] = self._ends[i:]
        runs[0] = max(position, runs[0])
        return runs

    def alone(self, position: int) -> int:
        """The most bytes of the runs of a record that names nothing below ``position``: these
        runs from its watermark, ``position`` or above (routing the next offsets only cuts
        them)."""
        i = self._i
        if i == len(self._ends):
            return 0
        start = max(position, self._starts[i])
        return _digits(start - position) + _digits(self._ends[i] - start) + 1 + self._after
