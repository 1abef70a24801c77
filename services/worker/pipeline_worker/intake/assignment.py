"""Newly assigned partitions, paused until what a previous owner left is read back.

A partition fetches nothing until three things are done, on the consumer thread after a poll
(never inside the rebalance callback, where a blocking call breaks the binding's call state):
its commit mark is read (offsets a previous owner finished or moved, which the loop skips, and
whether that owner died: see :mod:`..recovery.poison`), its idempotency keys are restored, and
our own mark is committed (``dirty``: an owner is running it) so that whoever comes after a
crash of ours can tell. Whatever fails is tried again after the next poll.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline._dedupstores import DedupStore
from pipeline._ratelog import RateLimitedLog

from ..commit.marks import CommitMark
from ..commit.offsetmap import Skips
from ..route.changelog import ChangelogMissingError

if TYPE_CHECKING:
    from .._work import PartitionState
    from ..commit.moves import Mover
    from ..recovery.poison import PoisonWatch

_log = logging.getLogger("pipeline.worker.consumer")

KEYS_RETRY_S = 1.0
"""How long after a failed restore of idempotency keys the next one is tried."""


class Assignment:
    """The partitions assigned but not fetching yet, and reading back what they need."""

    def __init__(
        self,
        consumer: Consumer,
        states: dict[tuple[str, int], PartitionState],
        poison: PoisonWatch,
        *,
        mover: Mover | None,
        dedup: DedupStore | None,
    ) -> None:
        self._consumer = consumer
        self._states = states
        self._poison = poison
        self._mover = mover
        self._dedup = dedup
        self._unmarked: list[PartitionState] = []
        """Assigned partitions, paused until their commit marks are read."""
        self._keys_retry_at = 0.0
        self._errors = RateLimitedLog(_log, interval_s=10.0)

    @property
    def pending(self) -> bool:
        return bool(self._unmarked)

    def add(self, states: Sequence[PartitionState]) -> None:
        """Partitions just assigned (and paused) in a rebalance callback."""
        self._unmarked.extend(states)

    def discard(self, states: Sequence[PartitionState]) -> None:
        """Partitions revoked or lost before they were read back."""
        self._unmarked = [s for s in self._unmarked if s not in states]

    def load(self, *, resume: bool) -> None:
        """Read the marks and keys of the pending partitions, secure them, let them fetch
        (``resume`` False: intake has stopped, they stay paused).

        A partition whose mark was read is never read again (it may be ours by then).
        """
        states = [s for s in self._unmarked if (s.topic, s.partition) in self._states]
        self._unmarked = []
        if not states:
            return
        fresh = [s for s in states if not self._poison.planned(s)]
        try:
            if fresh:
                tps = [TopicPartition(s.topic, s.partition) for s in fresh]
                committed = self._consumer.committed(tps, timeout=10.0)
                for state, tp in zip(fresh, committed, strict=True):
                    if tp.offset >= 0:
                        self._read_mark(state, CommitMark.decode(tp.offset, tp.metadata))
                    self._poison.plan(state, tp)
        except KafkaException as exc:
            self._errors.warning("marks", "could not read committed offsets, retrying: %s", exc)
            self._unmarked = states
            return
        if self._dedup is not None and not self._load_keys(self._dedup, states):
            self._unmarked = states
            return
        if not self._poison.secure(states):
            self._unmarked = states  # usually a rebalance in progress: after the next poll
            return
        if resume:
            for state in states:
                state.paused = False
            self._consumer.resume([TopicPartition(s.topic, s.partition) for s in states])

    def _load_keys(self, dedup: DedupStore, states: list[PartitionState]) -> bool:
        """Restore the idempotency keys of newly assigned partitions; False: try again later."""
        started = time.monotonic()
        if started < self._keys_retry_at:
            return False
        try:
            dedup.load([(s.topic, s.partition) for s in states])
        except ChangelogMissingError:
            raise  # nothing to wait for: the worker stops and says what to create
        except Exception as exc:
            _log.warning("could not restore the idempotency keys, retrying in 1s: %s", exc)
            self._keys_retry_at = time.monotonic() + KEYS_RETRY_S
            return False
        seconds = time.monotonic() - started
        if seconds >= 1.0:
            _log.info("idempotency keys restored", extra={"seconds": round(seconds, 1)})
        return True

    def _read_mark(self, state: PartitionState, mark: CommitMark) -> None:
        state.committed = mark.offset
        skips = mark.skips
        if skips:
            state.skips = Skips(skips)
        if mark.moved and self._mover is not None:
            # Listed apart in our commits too, until the commit point passes them.
            self._mover.restore_moved((state.topic, state.partition), mark.moved)
