"""Backpressure: a partition whose buffer is full is paused, and resumed once it drained; one
whose map of finished offsets outgrew the commit metadata is paused until the map fits again.
A newly assigned partition is paused until it is read back (:mod:`.assignment`), and resumes
then only if its map is not held.

Buffers are counted, not stored, here: ``handed - taken`` of a :class:`PartitionState` is what
its buffer holds (in transit to the loop, queued, or set aside by a key or a type limit). Polling
never stops; a paused partition simply delivers nothing, so a slow job never delays a poll.

librdkafka facts this relies on. A paused partition's prefetched messages are purged, and
``resume`` fetches again from the position, which is one past the last *delivered* message:
what was handed over is never fetched again and nothing is skipped (the loop still drops an
offset delivered twice). What was purged is fetched again, which is why the consumer's
prefetch is small (:data:`.config.PREFETCH_BYTES`). A partition keeps its pause flag across a
revoke and a later assignment, so the consumer resumes every partition it is assigned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .._metrics import WorkerMetrics
from .._work import PartitionState

RESUME_FRACTION = 0.5
"""A paused partition resumes once its buffer is down to this fraction of ``buffer_size``."""
WAKE_LIMIT = 8
WAKE_TIMEOUT_S = 0.02


class FlowControl:
    """Pauses full partitions and resumes drained ones (on the consumer thread)."""

    def __init__(
        self,
        consumer: Consumer,
        states: Mapping[tuple[str, int], PartitionState],
        buffer_size: int,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        self._consumer = consumer
        self._states = states
        self._size = buffer_size
        self._resume_at = int(buffer_size * RESUME_FRACTION)
        self._metrics = metrics
        self.paused: set[PartitionState] = set()
        """Partitions paused because their buffer is full."""
        self.held: set[PartitionState] = set()
        """Partitions paused because their finished-offset map is too large (see
        :meth:`hold`); one may be in :attr:`paused` too, and resumes when it leaves both."""
        self.arriving: set[PartitionState] = set()
        """Partitions assigned and paused until they are read back: only :meth:`admit` resumes
        them (the end of a hold meanwhile does not)."""
        self._stopped = False
        """Intake stopped (:meth:`pause_all`): nothing resumes any more."""

    def pause_full(self, states: Iterable[PartitionState]) -> None:
        """Pause those of ``states`` whose buffer reached ``buffer_size``."""
        full = []
        for state in states:
            if not state.paused and state.handed - state.taken >= self._size:
                state.paused = True
                self.paused.add(state)
                full.append(TopicPartition(state.topic, state.partition))
        if full:
            # Their messages so far were delivered, so the position is past them: the resume
            # fetches from there (the pause purges only what was fetched and not delivered).
            self._consumer.pause(full)

    def resume_drained(self) -> None:
        ready = [s for s in self.paused if s.handed - s.taken <= self._resume_at]
        if not ready:
            return
        everything_paused = len(self.paused | self.held) == len(self._states)
        for state in ready:
            self.paused.discard(state)
        self._resume([s for s in ready if s not in self.held], wake=everything_paused)

    def hold(self, state: PartitionState, over: bool) -> None:
        """Whether ``state``'s map of finished offsets is ``over`` what a commit may carry
        (the committer says so at each commit): if so, it takes nothing new until it is not.

        Pausing stops the fetch; what the loop holds already (at most the buffer) still runs,
        which is why the committer holds at a fraction of the limit.
        """
        owned = self._states.get((state.topic, state.partition)) is state
        if self._stopped or not owned or over == (state in self.held):
            return
        if over:
            self.held.add(state)
            if self._metrics is not None:
                self._metrics.map_holds += 1
            if not state.paused:
                state.paused = True
                self._consumer.pause([TopicPartition(state.topic, state.partition)])
        else:
            self.held.discard(state)
            if state not in self.paused and state not in self.arriving:
                everything_paused = len(self.paused | self.held) + 1 == len(self._states)
                self._resume([state], wake=everything_paused)
        if self._metrics is not None:
            self._metrics.map_held = len(self.held)

    def arrive(self, states: Iterable[PartitionState]) -> None:
        """``states`` were just assigned, and paused until they are read back."""
        self.arriving.update(states)

    def admit(self, states: Sequence[PartitionState]) -> None:
        """``states`` are read back (``read_back``; the messages held meanwhile are handed next):
        they fetch, but for those held for their map, which the end of the hold resumes (a
        commit made while they were read back may have held them)."""
        for state in states:
            state.read_back = True
        self.arriving.difference_update(states)
        if not self._stopped:
            self._resume([s for s in states if s not in self.held], wake=False)

    def _resume(self, states: list[PartitionState], *, wake: bool) -> None:
        if not states:
            return
        for state in states:
            state.paused = False
        partitions = [TopicPartition(s.topic, s.partition) for s in states]
        self._consumer.resume(partitions)
        if wake:
            self._wake_fetchers(partitions)

    def _wake_fetchers(self, partitions: list[TopicPartition]) -> None:
        """Make librdkafka fetch resumed partitions now rather than in up to a second.

        With every partition paused, a broker's thread has nothing to fetch and sleeps; a
        resume does not wake it, so the refill would wait for its next timed wake-up (~1 s,
        measured). Any request to the partition's leader wakes that thread, and it then
        fetches the resumed partition at once. The answer does not matter.
        """
        for tp in partitions[:WAKE_LIMIT]:
            with contextlib.suppress(KafkaException):
                self._consumer.get_watermark_offsets(tp, timeout=WAKE_TIMEOUT_S, cached=False)

    def pause_all(self) -> None:
        """Stop intake (shutdown): every owned partition paused, none to resume."""
        self._stopped = True
        todo = [s for s in self._states.values() if not s.paused]
        if todo:
            for state in todo:
                state.paused = True
            self._consumer.pause([TopicPartition(s.topic, s.partition) for s in todo])
        self.paused.clear()
        self.held.clear()
        self.arriving.clear()
        if self._metrics is not None:
            self._metrics.map_held = 0

    def forget(self, state: PartitionState) -> None:
        """``state`` was revoked."""
        self.paused.discard(state)
        self.held.discard(state)
        self.arriving.discard(state)
        if self._metrics is not None:
            self._metrics.map_held = len(self.held)
