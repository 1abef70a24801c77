"""The commit point of one partition: the lowest offset not yet finished.

Many jobs of a partition run at once and finish in any order. Committing the highest finished
offset would skip the unfinished ones below it if the worker crashed, so the commit point is the
contiguous watermark instead: every offset below it is finished. Offsets are added in delivery
order (increasing, with gaps where the log has control records or compacted messages); finishing
costs O(1) amortized: finished offsets above the head wait in a set until the head catches up.
"""

from __future__ import annotations

from collections import deque


class OffsetTracker:
    """Unfinished offsets of one partition and the offset that is safe to commit."""

    __slots__ = ("_done", "_next", "_pending")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._done: set[int] = set()
        self._next = -1

    def add(self, offset: int) -> None:
        """Record a delivered offset; offsets must be added in increasing order."""
        if offset < self._next:
            raise ValueError(f"offset {offset} added after {self._next - 1}")
        self._pending.append(offset)
        self._next = offset + 1

    def finish(self, offset: int) -> int | None:
        """Mark an added ``offset`` finished (finishing one below the watermark again is
        ignored) and return the :attr:`watermark` that leaves."""
        pending = self._pending
        if not pending:
            return self._next if self._next >= 0 else None
        head = pending[0]
        if offset == head:
            pending.popleft()
            done = self._done
            if done:
                while pending and pending[0] in done:
                    done.remove(pending.popleft())
            if not pending:
                return self._next
        elif head < offset < self._next:
            self._done.add(offset)
        return pending[0]

    @property
    def watermark(self) -> int | None:
        """The offset to commit: the lowest unfinished one, else one past the last added.

        ``None`` until the first offset is added (nothing to commit yet).
        """
        if self._pending:
            return self._pending[0]
        return self._next if self._next >= 0 else None

    @property
    def finished_count(self) -> int:
        """How many offsets above the watermark are finished."""
        return len(self._done)

    def finished_above(self) -> list[int]:
        """The finished offsets above the watermark, increasing.

        Safe from another thread than the one finishing offsets: ``sorted`` copies the set in
        one step under the GIL (iterating ints calls no Python code). The answer may be a
        moment old; every offset in it is finished all the same.
        """
        return sorted(self._done)

    def __len__(self) -> int:
        """How many added offsets are not finished."""
        return len(self._pending) - len(self._done)
