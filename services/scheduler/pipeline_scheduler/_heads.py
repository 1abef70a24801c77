"""Whether the next message of a source partition is routed now, or waits at its head. Pure.

A message that waits is parked (:attr:`PartitionProgress.parked`, with every message of its
partition read after it) and its partition is paused, for one of two reasons:

- the partition holds as many jobs as a progress record may name, or as many runs of them as
  may fit in one message (:attr:`PartitionProgress.full`): the next leader would refuse a
  record naming more, and release again what this one released; the producer refuses a record
  larger than ``message.max.bytes``, and no transaction would commit. It waits until held jobs
  are released;
- it is the head of a wait tier and its tier's delay has not passed (:meth:`HeadWaits.wake_of`).
  Every later message of its partition is due later.
"""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Message

from pipeline._codec import JobCodec
from pipeline._errors import DecodeError

from ._progress import PartitionProgress
from ._routing import Router

__all__ = ["HeadWaits"]

Where = tuple[str, int]


class HeadWaits:
    """The wait of each source partition's head; :attr:`wakes` holds when the head of a wait
    tier partition may leave it, for as long as it waits."""

    def __init__(self, router: Router, tier_index: Mapping[str, int], codec: JobCodec) -> None:
        self._router = router
        self._tier_index = tier_index
        self._codec = codec
        self.wakes: dict[Where, int] = {}

    def ready(self, where: Where, progress: PartitionProgress, message: Message, now: int) -> bool:
        """Whether ``message``, the next of partition ``where`` to route, is routed at ``now``
        (if so, the caller routes it: its wait is over)."""
        if progress.full:
            return False
        tier = self._tier_index.get(where[0])
        if tier is None or progress.finished_before(message.offset() or 0):
            return True
        wake = self.wakes.get(where)
        if wake is None:
            if self._router.tier_due(tier, message.timestamp()[1]) <= now:
                return True
            wake = self.wakes[where] = self.wake_of(tier, message, now)
        if wake > now:
            return False
        del self.wakes[where]
        return True

    def wake_of(self, tier: int, message: Message, now: int) -> int:
        """When ``message``, at the head of a partition of wait tier ``tier``, may leave it:
        the tier's delay after it was written, and no later than half a horizon before its
        job is due, where routing would have sent it anyway. A tier whose delay grew since
        the job was parked in it (or that a removed tier made a longer one), or a timestamp
        ahead of this clock (a leader whose clock ran ahead), would otherwise hold the job, and
        every job behind it, that much longer."""
        router = self._router
        written = min(message.timestamp()[1], now)
        wake = router.tier_due(tier, written)
        try:
            due = self._codec.decode(message.value() or b"").not_before
        except DecodeError:
            return now  # dead-lettered as soon as it is processed
        if due is not None:
            wake = min(wake, due - router.horizon_ms // 2)
        return wake
