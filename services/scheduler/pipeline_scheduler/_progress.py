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

Any writer can put anything on the topic, so :meth:`SavedProgress.decode` checks a record
before it trusts it: offsets are integers of Kafka's range, the held offsets lie between the
watermark and the position, and there are at most :data:`MAX_HELD` of them (runs are expanded
in memory; a record saying "a trillion offsets held" must not be). The leader's own records
stay within that bound, and within the producer's ``message.max.bytes``: a record larger than
that is refused as it is produced, which aborts the transaction, and every next term writes it
again (nothing more of the namespace is committed). :attr:`PartitionProgress.full` says when a
partition holds as many offsets as a record may name, or as many runs of them as may fit, and
the leader reads no further in it until some are released.

Releases split runs: released one by one out of offset order, a single run of ``n`` offsets
becomes up to ``n / 2`` runs. So the size bound is on the *weight* ``held + runs``, which no
release increases (a release takes one offset and adds at most one run) and which is at least
twice the runs: a partition that stops holding at weight ``2k`` never has more than ``k`` runs,
in whatever order its jobs fall due. :func:`record_size_bound` turns that into bytes.

A new leader replaying a committed record writes, until its position reaches the record's, the
offsets it holds *and* every offset the record names at or above its position
(:class:`ReplayRest`), so both count in its bound. A record written by an earlier release was
bounded by the count only: its rest may leave no room for a single held job. With nothing held,
every record the replay writes names a suffix of the committed one's offsets, no larger than it
(but for the digits its watermark gains): the leader then routes one message at a time, each
held job released before the next is routed, as long as the producer takes that suffix; when
it does not (``message.max.bytes`` lowered since), the partition stays paused
(:attr:`PartitionProgress.replay_overflow`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import Any

from pipeline._messagesize import LIBRDKAFKA_MESSAGE_MAX_BYTES, PRODUCE_OVERHEAD, RECORD_OVERHEAD

from ._progressrecord import (
    MAX_HELD,
    MAX_OFFSET,
    BadProgressError,
    SavedProgress,
    extend_runs,
    runs_of,
)
from ._replayrest import ReplayRest

__all__ = [
    "MAX_HELD",
    "BadProgressError",
    "PartitionProgress",
    "SavedProgress",
    "record_room",
    "record_size_bound",
]

RESUME_FRACTION = 0.9
"""A partition that reached the bound is read again once it holds this fraction of it: each pause
drops what the consumer fetched ahead, so the leader does not pause at every release."""
MAX_KEY_BYTES = 300
"""Room for a record's key, ``offsets:<topic>:<partition>`` (a topic name has at most 249
characters), where the key is not known."""
_FRAME_BYTES = len('{"v":2,"w":,"p":,"r":[]}')
_HEADER_BYTES = _FRAME_BYTES + 2 * len(str(MAX_OFFSET))
_MAX_NUMBER_BYTES = 2 + len(str(MAX_OFFSET))
"""The most a number of a record takes with its comma, in :func:`record_size_bound`'s count:
``2 + log10(x)`` for ``x`` up to :data:`MAX_OFFSET` (a few digits to spare)."""
_PRODUCER_SLACK = RECORD_OVERHEAD - PRODUCE_OVERHEAD
"""What the producer takes beyond :func:`record_room`: librdkafka's own check."""


def record_room(
    max_bytes: int = LIBRDKAFKA_MESSAGE_MAX_BYTES, key_bytes: int = MAX_KEY_BYTES
) -> int:
    """The most bytes a progress record's value may take, written with a key of ``key_bytes``
    by a producer sending at most ``max_bytes`` (``message.max.bytes``): what the broker adds
    to a record in a transaction is left out too (:data:`RECORD_OVERHEAD`)."""
    return max_bytes - RECORD_OVERHEAD - key_bytes


def record_size_bound(weight: int, span: int) -> int:
    """The most bytes :meth:`SavedProgress.encode` takes for held offsets of ``weight``
    (held + runs; see the module's doc) lying within ``span`` offsets above the watermark.

    The record is ``2 * runs`` numbers (gaps and lengths) and a comma after each but the last,
    and the numbers add up to at most ``span``. A number ``x`` has at most ``1 + log10(x + 1)``
    digits and the logarithm is concave, so ``n`` of them have at most
    ``n * (1 + log10((span + n) / n))`` digits, which grows with ``n``; ``n`` is at most
    ``weight``."""
    numbers = max(weight, 1)
    runs_bytes = numbers * (2 + math.log10((max(span, 0) + numbers) / numbers))  # and commas
    return _HEADER_BYTES + math.ceil(runs_bytes) + 1  # + 1: the rounding of the logarithm


class PartitionProgress:
    """Held offsets, parked messages and the position of one source partition.

    It holds at most ``max_held`` offsets (:data:`MAX_HELD`, the bound the records are read
    back with), and no more than its record, of at most ``room`` bytes (:func:`record_room`),
    may name in whatever order they are released: the leader routes nothing more of the
    partition while it is :attr:`full`, and fetches again once it :attr:`may_resume`.
    """

    __slots__ = (
        "_free_weight",
        "_held",
        "_lowest",
        "_rest",
        "_resume_at",
        "_runs",
        "dirty",
        "max_held",
        "parked",
        "position",
        "replay_held",
        "replay_until",
        "room",
    )

    def __init__(
        self,
        committed: int | None = None,
        saved: SavedProgress | None = None,
        max_held: int = MAX_HELD,
        room: int | None = None,
    ) -> None:
        self.max_held = max_held
        self._resume_at = int(max_held * RESUME_FRACTION)
        self.room = record_room() if room is None else room
        self._free_weight = (self.room - _HEADER_BYTES - 1) // _MAX_NUMBER_BYTES
        """Held + runs below which no record can outgrow :attr:`room`: :attr:`full` needs no
        size bound (:func:`record_size_bound` is at most ``_MAX_NUMBER_BYTES`` a number)."""
        self.position: int | None = committed
        self._held: set[int] = set()
        self._runs = 0
        """Runs of consecutive offsets in ``_held``, kept as offsets are held and released."""
        self._lowest: list[int] = []
        # Messages read before they may be routed (the head of a wait tier before it may leave
        # it, or anything while the partition is full); the partition is paused.
        self.parked: deque[Any] = deque()
        self.replay_until = -1
        self.replay_held: frozenset[int] = frozenset()
        self._rest: ReplayRest | None = None
        """While replaying a record that names held offsets above the position."""
        if saved is not None and committed is not None and saved.watermark == committed:
            self.replay_until = saved.position
            self.replay_held = frozenset(saved.held)
            if saved.runs:
                self._rest = ReplayRest(saved.watermark, saved.position, saved.runs)
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
        rest = self._rest
        if rest is not None:
            if self.position < rest.limit:
                rest.advance(self.position)
            else:
                self._rest = None  # the replay is over

    def hold(self, offset: int) -> None:
        held = self._held
        if offset in held:
            return
        self._runs += 1 - ((offset - 1) in held) - ((offset + 1) in held)
        held.add(offset)
        heapq.heappush(self._lowest, offset)

    def release(self, offset: int) -> None:
        held = self._held
        if offset in held:
            held.remove(offset)
            self._runs -= 1 - ((offset - 1) in held) - ((offset + 1) in held)
        self.dirty = True

    @property
    def held_count(self) -> int:
        return len(self._held)

    @property
    def runs(self) -> int:
        """Runs of consecutive held offsets (what the record's size grows with)."""
        return self._runs

    @property
    def full(self) -> bool:
        """Whether it holds as many offsets as a record may name, or routing one more message
        (held, and one offset further) could let a record outgrow :attr:`room` once releases
        split the runs: the next message waits. Holding nothing, a replaying partition routes
        the next message unless the producer refuses what is left of the committed record
        (:attr:`replay_overflow`): the records it writes are never larger (see the module's
        doc), and waiting would free nothing."""
        held = len(self._held)
        if held >= self.max_held:
            return True
        if self._rest is None and held + self._runs + 2 <= self._free_weight:
            return False  # the common case, one message at a time: no logarithm
        if self._next_size() <= self.room:
            return False
        return bool(self._held) or self.replay_overflow is not None

    @property
    def may_resume(self) -> bool:
        """Whether a partition paused while full may fetch again: it holds
        :data:`RESUME_FRACTION` of the bound, and its record may take that fraction of
        :attr:`room`; or it holds nothing, and is not full."""
        if not self._held:
            return not self.full
        return (
            len(self._held) <= self._resume_at and self._next_size() <= self.room * RESUME_FRACTION
        )

    @property
    def replaying(self) -> bool:
        """Whether its records still name offsets of a committed record above the position."""
        return self._rest is not None

    @property
    def replay_overflow(self) -> int | None:
        """Bytes by which what is left of a replayed record, with nothing held, exceeds
        :attr:`room`, when the producer refuses it too (its ``message.max.bytes`` is smaller
        than the one it was written with): nothing more of the partition may be routed (each
        next record would name that rest). None otherwise."""
        rest, position = self._rest, self.position
        if rest is None or position is None or self._held:
            return None
        size = _FRAME_BYTES + 2 * len(str(rest.limit)) + rest.alone(position)
        return size - self.room if size > self.room + _PRODUCER_SLACK else None

    @property
    def crowded(self) -> bool:
        """Whether it is :attr:`full` for the rest of a replayed record only: it holds few jobs
        at a time (one, with no room left beside the rest) until the replay is over."""
        rest, position = self._rest, self.position
        if rest is None or position is None or len(self._held) >= self.max_held:
            return False
        return self.full and self._next_size() - rest.bound(position) <= self.room

    def _next_size(self) -> int:
        """The bound of the record's size once one more message is routed and held, with what
        is left of a replayed record."""
        watermark = self.watermark
        position = self.position
        if watermark is None or position is None:
            return record_size_bound(2, 1)
        size = record_size_bound(len(self._held) + self._runs + 2, position - watermark + 1)
        rest = self._rest
        return size if rest is None else size + rest.bound(position)

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
        # Every offset held is below the position: it is held as it is processed.
        runs = runs_of(sorted(self._held))
        if position < self.replay_until:
            # Still replaying: beyond what this term has read, the last record stands (else a
            # later term would route again what an earlier one released or moved), its runs
            # from the position on as they were.
            rest = self._rest.runs(position) if self._rest is not None else []
            if rest:
                extend_runs(runs, rest[0], rest[1])  # joined if the two touch
                runs += rest[2:]
            position = self.replay_until
        return SavedProgress(watermark, position, runs=tuple(runs))
