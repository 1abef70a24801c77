"""Jobs waiting in memory for their due time, soonest first: a binary heap. Pure.

Only jobs due within the horizon are here, so the heap stays small; each entry keeps the raw
message (key, value, headers) to release byte for byte, and where it came from (for the commit).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from pipeline._transactions import Headers


@dataclass(slots=True, order=True)
class HeldJob:
    """A delayed job in memory: released to ``target`` at ``due_ms`` exactly as it was read."""

    due_ms: int
    seq: int
    source: tuple[str, int] = field(compare=False)
    offset: int = field(compare=False)
    target: str = field(compare=False)
    key: bytes | None = field(compare=False)
    value: bytes = field(compare=False)
    headers: Headers = field(compare=False)
    job_id: str = field(compare=False)


class DueQueue:
    """A min-heap of :class:`HeldJob` by due time (ties: arrival order)."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[HeldJob] = []
        self._seq = 0

    def push(
        self,
        due_ms: int,
        source: tuple[str, int],
        offset: int,
        target: str,
        key: bytes | None,
        value: bytes,
        headers: Headers,
        job_id: str,
    ) -> None:
        self._seq += 1
        job = HeldJob(due_ms, self._seq, source, offset, target, key, value, headers, job_id)
        heapq.heappush(self._heap, job)

    def next_due(self) -> int | None:
        """The due time of the soonest job, or None when empty."""
        return self._heap[0].due_ms if self._heap else None

    def pop_due(self, now_ms: int, limit: int) -> list[HeldJob]:
        """Remove the jobs due at ``now_ms`` or before, soonest first, at most ``limit``."""
        heap = self._heap
        out: list[HeldJob] = []
        while heap and heap[0].due_ms <= now_ms and len(out) < limit:
            out.append(heapq.heappop(heap))
        return out

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)
