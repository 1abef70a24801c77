"""Offset commits: each partition's commit point, asynchronously in steady state.

The commit point of a partition is its contiguous watermark (``PartitionState.commit_offset``,
published by the event loop): the lowest offset not finished, which is the next offset to
consume, as Kafka wants it (librdkafka commits offsets as given, no +1). Commits are batched:
one asynchronous commit of every partition whose point moved, every ``commit_interval_s`` or
after ``commit_every`` finished jobs, whichever comes first. Revocation, the end of a burst run
and shutdown commit synchronously. Only owned partitions are ever committed: a revoked one
leaves the table before its final commit, and nothing commits it after.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from ._metrics import WorkerMetrics
from ._ratelog import RateLimitedLog

if TYPE_CHECKING:
    from ._work import PartitionState

_log = logging.getLogger("pipeline.worker.commits")


class Committer:
    """Commits for the consumer thread (every call happens on that thread)."""

    def __init__(self, metrics: WorkerMetrics, *, interval_s: float, every: int) -> None:
        self._metrics = metrics
        self._interval = interval_s
        self._every = every
        self._consumer: Consumer | None = None
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._next = 0.0
        self._finished_at_last = 0
        self._started: deque[float] = deque()
        self._errors = RateLimitedLog(_log, interval_s=10.0)

    def attach(self, consumer: Consumer, states: dict[tuple[str, int], PartitionState]) -> None:
        """The consumer to commit with, and the table of owned partitions (shared, not copied)."""
        self._consumer = consumer
        self._states = states

    def due(self, now: float, finished: int) -> bool:
        """Whether the interval passed or ``commit_every`` jobs finished since the last commit."""
        return now >= self._next or finished - self._finished_at_last >= self._every

    def offsets(self, states: Sequence[PartitionState]) -> list[TopicPartition]:
        """Each partition's commit point, where it moved past what was committed.

        When everything handed over is finished, the consumer's position may be further on:
        past transaction markers, which are never delivered. Committing the position then
        keeps the committed offset equal to the end offset instead of one short of it.
        """
        assert self._consumer is not None
        idle = [s for s in states if s.handed_next >= 0 and s.commit_offset == s.handed_next]
        positions: dict[PartitionState, int] = {}
        if idle:
            found = self._consumer.position([TopicPartition(s.topic, s.partition) for s in idle])
            positions = {s: tp.offset for s, tp in zip(idle, found, strict=True)}
        offsets = []
        for state in states:
            offset = max(state.commit_offset, positions.get(state, -1))
            if offset >= 0 and offset > state.committed:
                offsets.append(TopicPartition(state.topic, state.partition, offset))
        return offsets

    def commit(
        self,
        states: Iterable[PartitionState],
        now: float,
        *,
        sync: bool = False,
        finished: int | None = None,
    ) -> bool:
        """Commit the commit points of ``states``.

        Returns whether everything is committed (an asynchronous commit counts as done).
        """
        assert self._consumer is not None
        self._next = now + self._interval
        if finished is not None:
            self._finished_at_last = finished
        offsets = self.offsets(list(states))
        if not offsets:
            return True
        if not sync:
            self._started.append(time.monotonic())
            try:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            except KafkaException as exc:
                self._started.pop()
                self._metrics.count_commit("async", False, None)
                self._errors.warning("commit", "offset commit failed: %s", exc)
            return True
        started = time.monotonic()
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._metrics.count_commit("sync", False, time.monotonic() - started)
            # Usually a rebalance in progress; the callers try again.
            _log.info(
                "synchronous offset commit refused: %s", exc, extra={"offsets": describe(offsets)}
            )
            return False
        self._metrics.count_commit("sync", True, time.monotonic() - started)
        return self._record(result or [])

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's callback for asynchronous commits (served by ``poll``, in order)."""
        started = self._started.popleft() if self._started else None
        seconds = time.monotonic() - started if started is not None else None
        self._metrics.count_commit("async", error is None, seconds)
        if error is not None:
            self._errors.warning("commit", "offset commit failed: %s", error.str())
            return
        self._record(partitions)

    def _record(self, partitions: list[TopicPartition]) -> bool:
        ok = True
        for tp in partitions:
            if tp.error is not None:
                ok = False
                self._errors.warning(
                    "commit", "offset commit of %s[%d] failed: %s", tp.topic, tp.partition, tp.error
                )
                continue
            state = self._states.get((tp.topic, tp.partition))
            if state is not None and tp.offset > state.committed:
                state.committed = tp.offset
        return ok


def describe(partitions: Sequence[TopicPartition]) -> str:
    """``topic[partition]@offset,...`` for log lines."""
    return ",".join(f"{tp.topic}[{tp.partition}]@{tp.offset}" for tp in partitions)
