"""Moves that wait for room in their partition's commit mark, and the idempotency keys they hold.

A commit's mark lists the offsets moved above the partition's commit point, and only so many
fit in the offset metadata (:func:`.marks.max_moved`): a move above a long job waits here until
the commit point passes enough of them (see :class:`.moves.Mover`). The moves of one partition
wait in the order they were submitted.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from .movetxn import Pending, Where

if TYPE_CHECKING:
    from ..route.policy import Record

ChangelogKey = tuple[int | None, bytes | None]
"""A changelog record's partition and key: one idempotency key's place."""


class WaitingMoves:
    """The moves waiting for room, by partition; ``changelog`` is the idempotency keys' topic."""

    def __init__(self, changelog: str) -> None:
        self._changelog = changelog
        self._waiting: dict[Where, deque[Pending]] = {}
        self._keys_held: Counter[ChangelogKey] = Counter()
        """The idempotency keys of the changelog records of the waiting moves (see
        :meth:`supersede`)."""

    def __bool__(self) -> bool:
        return bool(self._waiting)

    @property
    def holds_keys(self) -> bool:
        """Whether a waiting move holds a changelog record (rare: a long job holds moves)."""
        return bool(self._keys_held)

    def hold(self, pending: Pending) -> None:
        """``pending`` waits for room, after the moves of its partition waiting already."""
        self._waiting.setdefault(pending.where, deque()).append(pending)
        self._keys_held.update(self._keys(pending.records))

    def ready(self, goes: Callable[[Where, Pending], bool]) -> Iterator[Pending]:
        """The waiting moves that ``goes`` lets go now, each partition's in order; they wait
        no more once yielded (the caller writes each before asking for the next, and may call
        :meth:`supersede` meanwhile: what waits then is exactly what is left)."""
        for where in [w for w, held in self._waiting.items() if held]:
            queue = self._waiting[where]
            for _ in range(len(queue)):  # one turn round: those that stay keep their order
                pending = queue.popleft()
                if goes(where, pending):
                    self._unhold(pending.records)
                    yield pending
                else:
                    queue.append(pending)
            if not queue:
                del self._waiting[where]

    def drop(self, where: Where) -> list[Pending]:
        """The moves of ``where`` (given up), which wait no more."""
        dropped = list(self._waiting.pop(where, ()))
        for pending in dropped:
            self._unhold(pending.records)
        return dropped

    def supersede(self, written: Pending) -> None:
        """Take out of the moves submitted before ``written`` and still waiting the changelog
        records of the idempotency keys that ``written`` wrote: written ahead of those moves,
        its records are the newer state of their keys, which an older record written after
        them would undo (a dead letter's tombstone of a key that another job has claimed
        since). A key's records may come from moves of any priority's partition of the same
        number, which wait for room each on its own: so the records of one key reach the
        changelog in the order they were submitted, whichever partition has room first."""
        held = self._keys_held
        keys = {key for key in self._keys(written.records) if held[key] > 0}
        if not keys:
            return  # the common case: no waiting move holds a record of these keys
        changelog = self._changelog
        before = written.submitted
        for pending in (p for waiting in self._waiting.values() for p in waiting):
            if pending.submitted >= before:
                continue  # newer: written after ``written``, as it should be
            kept = [
                r
                for r in pending.records
                if r.topic != changelog or (r.partition, r.key) not in keys
            ]
            if len(kept) < len(pending.records):
                self._unhold(pending.records)
                pending.records = kept
                held.update(self._keys(kept))

    def _unhold(self, records: Sequence[Record]) -> None:
        """``records`` of a move no longer waiting: their keys leave :attr:`_keys_held`."""
        held = self._keys_held
        for key in self._keys(records):
            held[key] -= 1
            if held[key] <= 0:
                del held[key]

    def _keys(self, records: Sequence[Record]) -> list[ChangelogKey]:
        """The idempotency keys (changelog partition and key) that ``records`` write."""
        changelog = self._changelog
        return [(r.partition, r.key) for r in records if r.topic == changelog]
