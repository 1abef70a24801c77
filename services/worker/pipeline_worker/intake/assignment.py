"""Newly assigned partitions, paused until what a previous owner left is read back.

Under ``worker.dedup_scope = "namespace"`` a partition waits first for the rest of its slot:
partition p of every priority topic this worker consumes, which share one table of idempotency
keys. The group's assignor co-partitions (see :mod:`.groupproto`), but an incremental protocol
may hand the partitions of p over one heartbeat after another; running p of one topic while
another member still runs p of another could run one key twice.

A partition fetches nothing until three things are done, on the consumer thread after a poll
(never inside the rebalance callback, where a blocking call breaks the binding's call state):
its commit mark is read (offsets a previous owner finished or moved, which the loop skips, and
whether that owner died: see :mod:`..recovery.poison`), its idempotency keys are restored, and
our own mark is committed (``dirty``: an owner is running it) so that whoever comes after a
crash of ours can tell. Whatever fails is tried again after the next poll, but for a restore
of keys: it runs on a helper thread (:mod:`.keyload`), the consumer thread polling and
committing meanwhile, and a failed one is tried again after a wait that doubles. The partition
stays paused until its keys are taken.

A partition is paused in the rebalance callback, right after it is assigned, and yet librdkafka
can deliver a few messages it fetched in between (seen under load: a job run before its keys
were restored). Those are held here (:meth:`Assignment.hold`) and handed, in order, once the
partition is read back, before anything it fetches after its resume.

A partition read back resumes through :meth:`.flow.FlowControl.admit`: one whose finished map is
held (see :meth:`.flow.FlowControl.hold`) stays paused until the map fits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from pipeline._dedupstores import DedupStore
from pipeline._ratelog import RateLimitedLog

from ..commit.marks import CommitMark
from ..commit.offsetmap import Skips
from .keyload import KeyLoad

if TYPE_CHECKING:
    from .._work import PartitionState
    from ..commit.moves import Mover
    from ..recovery.poison import PoisonWatch
    from .flow import FlowControl

READ_MARKS_S = 10.0
"""How long reading the committed offsets (and their marks) of new partitions may take."""

_log = logging.getLogger("pipeline.worker.consumer")

SLOT_WAIT_WARN_S = 15.0
"""How long a partition may wait for the rest of its slot before the worker says so."""


class Assignment:
    """The partitions assigned but not fetching yet, and reading back what they need."""

    def __init__(
        self,
        consumer: Consumer,
        states: dict[tuple[str, int], PartitionState],
        poison: PoisonWatch,
        *,
        flow: FlowControl,
        mover: Mover | None,
        dedup: DedupStore | None,
        slots: Slots | None = None,
    ) -> None:
        self._consumer = consumer
        self._slots = slots
        self._states = states
        self._poison = poison
        self._mover = mover
        self._keys = KeyLoad(dedup, self._owned) if dedup is not None else None
        """Restores of idempotency keys, on a helper thread."""
        self._unmarked: list[PartitionState] = []
        """Assigned partitions, paused until their commit marks are read."""
        self._early: dict[PartitionState, list[Message]] = {}
        """Messages delivered for partitions of :attr:`_unmarked` (see :meth:`hold`)."""
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._flow = flow
        """Resumes partitions once read back (they stay paused while their map is held)."""

    @property
    def pending(self) -> bool:
        return bool(self._unmarked)

    def due(self) -> bool:
        """Whether :meth:`load` has anything to do: partitions wait, and not only for a restore
        of keys that runs or waits for its next try."""
        keys = self._keys
        if keys is not None and keys.ended:
            return True  # to take, even for partitions given up since: they are unloaded then
        return bool(self._unmarked) and (keys is None or keys.due(self._unmarked))

    def unload(self, states: Sequence[PartitionState]) -> None:
        """Unload the keys of ``states``, given up (once a restore running for them ended)."""
        if self._keys is not None and states:
            self._keys.unload(states)

    def close(self) -> None:
        """The consumer closes: a restore of keys still running is not waited for."""
        if self._keys is not None:
            self._keys.close()

    def _owned(self, state: PartitionState) -> bool:
        """Whether ``state`` is still its partition's assignment (not revoked, not assigned
        anew)."""
        return self._states.get((state.topic, state.partition)) is state

    def add(self, states: Sequence[PartitionState]) -> None:
        """Partitions just assigned (and paused) in a rebalance callback."""
        self._unmarked.extend(states)
        self._flow.arrive(states)

    def discard(self, states: Sequence[PartitionState]) -> None:
        """Partitions revoked or lost before they were read back."""
        self._unmarked = [s for s in self._unmarked if s not in states]
        for state in states:
            self._early.pop(state, None)

    def hold(self, state: PartitionState, group: list[Message]) -> bool:
        """Whether ``group`` (consumed messages of ``state``, in order) is held because the
        partition is not read back yet; :meth:`load` gives it back once it is."""
        if state not in self._unmarked:
            return False
        self._early.setdefault(state, []).extend(group)
        return True

    def load(self, *, resume: bool) -> list[Message]:
        """Read the marks and keys of the pending partitions, secure them, let them fetch
        (``resume`` False: intake has stopped, they stay paused). Returns the messages held
        for the partitions now read back (none if intake has stopped): to hand before any
        other of theirs. Their keys are restored on a helper thread: a call starts a restore,
        a later one takes its keys (see :meth:`due`).

        A partition whose mark was read is never read again (it may be ours by then).
        """
        if self._keys is not None:
            self._keys.collect()
        states = [s for s in self._unmarked if self._owned(s)]
        for gone in [s for s in self._early if s not in states]:
            del self._early[gone]
        self._unmarked = []
        if self._slots is not None:
            states, self._unmarked = self._slots.split(states)
        if not states:
            return []
        if not self._read_marks(states):
            self._unmarked += states
            return []
        if self._keys is not None:
            ready = self._keys.ready(states)
            self._unmarked += [s for s in states if s not in ready]  # restored meanwhile
            states = ready
            if not states:
                return []
        if not self._poison.secure(states):
            self._unmarked += states  # usually a rebalance in progress: after the next poll
            return []
        if self._keys is not None:
            self._keys.done_with(states)
        early = [m for s in states for m in self._early.pop(s, ())]
        if not resume:
            return []  # not run: their offsets are not committed, the next owner reads them
        self._flow.admit(states)  # they fetch, but for those held for their map
        # Delivered before the pause: handed even to a held partition, as what its buffer held
        # when a hold began still runs.
        return early

    def _read_marks(self, states: list[PartitionState]) -> bool:
        """Read the commit marks of those of ``states`` not read yet; False: try again later."""
        fresh = [s for s in states if not self._poison.planned(s)]
        try:
            if fresh:
                tps = [TopicPartition(s.topic, s.partition) for s in fresh]
                committed = self._consumer.committed(tps, timeout=READ_MARKS_S)
                for state, tp in zip(fresh, committed, strict=True):
                    # The plan first: its watermarks may not be read, and a partition whose
                    # mark was taken without its plan would be committed with a plain mark,
                    # over the previous owner's (its deaths, its quarantine) before the retry.
                    self._poison.plan(state, tp)
                    if tp.offset >= 0:
                        self._read_mark(state, CommitMark.decode(tp.offset, tp.metadata))
        except KafkaException as exc:
            self._errors.warning("marks", "could not read committed offsets, retrying: %s", exc)
            return False
        return True

    def _read_mark(self, state: PartitionState, mark: CommitMark) -> None:
        state.committed = mark.offset
        skips = mark.skips
        if skips:
            state.skips = Skips(skips)
        if mark.moved and self._mover is not None:
            # Listed apart in our commits too, until the commit point passes them.
            self._mover.restore_moved((state.topic, state.partition), mark.moved)


class Slots:
    """Which assigned partitions have the rest of their slot (partition p of every priority
    topic consumed), and a warning for those that wait long."""

    def __init__(
        self,
        topics: Sequence[str],
        states: dict[tuple[str, int], PartitionState],
        partition_counts: dict[str, int],
    ) -> None:
        self._topics = topics
        self._states = states
        self._counts = partition_counts
        """Partitions per topic, as far as known (a topic with fewer has no partition p)."""
        self._waiting_since: dict[int, float] = {}
        self._warnings = RateLimitedLog(_log, interval_s=60.0)

    def missing(self, partition: int) -> list[str]:
        """The topics whose partition ``partition`` is not assigned to this member."""
        return [
            topic
            for topic in self._topics
            if (topic, partition) not in self._states
            and partition < self._counts.get(topic, partition + 1)
        ]

    def split(
        self, states: Sequence[PartitionState]
    ) -> tuple[list[PartitionState], list[PartitionState]]:
        """(``states`` whose slot is whole, those that wait for the rest of theirs)."""
        whole: list[PartitionState] = []
        waiting: list[PartitionState] = []
        now = time.monotonic()
        for state in states:
            missing = self.missing(state.partition)
            if not missing:
                whole.append(state)
                self._waiting_since.pop(state.partition, None)
                continue
            waiting.append(state)
            since = self._waiting_since.setdefault(state.partition, now)
            if now - since >= SLOT_WAIT_WARN_S:
                self._warnings.warning(
                    f"slot {state.partition}",
                    "partition %d of %s waits for partition %d of %s, which the group has not "
                    "assigned to this worker for %.0fs: its idempotency keys are shared with "
                    "them (worker.dedup_scope = namespace). Do all workers of the group "
                    "consume the same priorities, and do the priority topics have as many "
                    "partitions?",
                    state.partition,
                    state.topic,
                    state.partition,
                    ", ".join(missing),
                    now - since,
                )
        return whole, waiting
