"""Offset commits: each partition's commit point, asynchronously in steady state.

The commit point of a partition is its contiguous watermark (``PartitionState.commit_offset``,
published by the event loop): the lowest offset not finished, which is the next offset to
consume, as Kafka wants it (librdkafka commits offsets as given, no +1). Commits are batched:
one asynchronous commit of every partition whose point moved, every ``commit_interval_s`` or
after ``commit_every`` finished jobs, whichever comes first. Revocation, the end of a burst run
and shutdown commit synchronously. Only owned partitions are ever committed: a revoked one
leaves the table before its final commit, and nothing commits it after.

Each commit's metadata (:class:`.marks.CommitMark`) also lists the offsets finished above the
commit point, so that a new owner skips them; a partition whose map of them changed is
committed even where its commit point stands still (behind a long job). A map that grows past
:data:`HOLD_FRACTION` of the metadata limit holds the partition (it takes no new jobs, see
:meth:`..intake.flow.FlowControl.hold`) until it is back under; one that outgrew the whole
limit meanwhile is cut short (the jobs above the cut would run again after a crash).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from pipeline._ratelog import RateLimitedLog

from .._metrics import WorkerMetrics
from . import offsetmap
from .finished import finished_runs
from .marks import METADATA_MAX_BYTES, CommitMark, fit, promised
from .moves import Mover
from .positions import idle as is_idle
from .positions import positions as positions_of

if TYPE_CHECKING:
    from .._work import PartitionState
    from ..recovery.guard import Guard

_log = logging.getLogger("pipeline.worker.commits")

HOLD_FRACTION = 0.75
"""A partition whose whole mark is longer than this fraction of the metadata limit takes no new
jobs: the rest is room for the jobs already taken, which still finish."""
IN_FLIGHT_WAIT_S = 5.0
"""A scheduled asynchronous commit waits while the previous one is unanswered (at most this
long; the next due commit carries its offsets). Commits queued on the group coordinator's
connection hold back the group heartbeats behind them: on a loaded cluster a consumer-protocol
member's heartbeat then timed out, librdkafka backed it off for minutes and the member was
fenced once its session expired. The last commit of a revoked partition and pushed marks never
wait."""


class Committer:
    """Commits for the consumer thread (every call happens on that thread)."""

    def __init__(
        self,
        metrics: WorkerMetrics,
        *,
        interval_s: float,
        every: int,
        mover: Mover | None = None,
        metadata_limit: int = METADATA_MAX_BYTES,
    ) -> None:
        self._metrics = metrics
        self._mover = mover
        self._interval = interval_s
        self._every = every
        self._limit = metadata_limit
        self._hold_at = int(metadata_limit * HOLD_FRACTION)
        self._consumer: Consumer | None = None
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._guards: Mapping[tuple[str, int], Guard] = {}
        self._hold: Callable[[PartitionState, bool], None] | None = None
        self._next = 0.0
        self._finished_at_last = 0
        self._started: deque[float] = deque()
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._positions = True
        """Whether an idle partition's commit point may be the consumer's position (see
        :meth:`without_positions`)."""

    def attach(
        self,
        consumer: Consumer,
        states: dict[tuple[str, int], PartitionState],
        guards: Mapping[tuple[str, int], Guard] | None = None,
        hold: Callable[[PartitionState, bool], None] | None = None,
    ) -> None:
        """The consumer to commit with, the table of owned partitions and their poison-pill
        guards (shared, not copied), which say what each commit's mark promises, and what to
        tell whether a partition's finished map is too large to take new jobs."""
        self._consumer = consumer
        self._states = states
        if guards is not None:
            self._guards = guards
        self._hold = hold

    @contextlib.contextmanager
    def without_positions(self) -> Iterator[None]:
        """Commits made in the block take no partition's commit point from the consumer's
        position: a rebalance callback runs inside ``poll()`` or ``consume()``, and the messages
        those returned before it, handed over only once it is done, are behind the position
        already (committed past, they would never run)."""
        self._positions = False
        try:
            yield
        finally:
            self._positions = True

    def land(self) -> None:
        """Wait for the moves' commit in flight, if any (see :mod:`.flight`), and settle it."""
        if self._mover is not None:
            self._mover.land()

    @property
    def in_transaction(self) -> bool:
        """Whether the mover's transaction is open (records of ours not committed yet)."""
        return self._mover is not None and self._mover.open

    def awaiting(self, now: float) -> bool:
        """Whether an asynchronous commit is unanswered, the newest sent less than
        ``IN_FLIGHT_WAIT_S`` ago (an older one left unanswered does not end the wait for it).

        A transaction must not open meanwhile: its offsets reach the group coordinator over the
        producer's connection, and that commit, still on its way over the consumer's, could
        land after them and put back an older mark, one without the transaction's moves (their
        jobs would run again after a crash). While a transaction is open every commit goes
        with it, so once this is answered the two cannot cross."""
        return bool(self._started) and now - self._started[-1] < IN_FLIGHT_WAIT_S

    def due(self, now: float, finished: int) -> bool:
        """Whether the interval passed or ``commit_every`` jobs finished since the last commit."""
        return now >= self._next or finished - self._finished_at_last >= self._every

    def offsets(
        self, states: Sequence[PartitionState], *, clean: bool = False, force: bool = False
    ) -> list[TopicPartition]:
        """Each partition's commit point, where it moved past what was committed, or where the
        open transaction moved one of its jobs; with its :class:`CommitMark` as metadata.

        When everything handed over is finished, the consumer's position may be further on:
        past transaction markers, which are never delivered. Committing the position then
        keeps the committed offset equal to the end offset instead of one short of it. So for
        a partition at its end (burst mode) that handed nothing: what lies between its
        committed offset and its end (markers, aborted records, records retention deleted) is
        never delivered, and the other members of a burst wait for its commit to reach it. Never
        for one not read back yet: messages delivered before its pause are held, not handed;
        nor in a rebalance callback (:meth:`without_positions`).
        ``clean``: the last commit before the partition is handed over in good order.
        ``force``: every partition of ``states``, moved or not. A partition whose guard (see
        :mod:`..recovery.poison`) made a promise Kafka has not acknowledged is always included.
        """
        assert self._consumer is not None
        idle = [s for s in states if is_idle(s)] if self._positions else []
        positions = positions_of(self._consumer, idle)
        mover = self._mover
        touched = set(mover.touched()) if mover is not None and mover.open else set()
        stranded = mover.stranded() if mover is not None else set()
        guards = self._guards
        offsets = []
        for state in states:
            offset = max(state.commit_offset, positions.get(state, -1), state.committed)
            where = (state.topic, state.partition)
            if where in stranded:  # see _left_out
                continue
            guard = guards.get(where)
            if guard is not None:
                offset = max(offset, guard.floor)
            mapped = state.tracker.finished_count
            if offset < 0 or not (
                offset > state.committed
                or mapped != state.mapped
                or where in touched
                or clean
                or force
                or (guard is not None and guard.unsecured)
            ):
                continue
            moved = mover.moved_above(where, offset) if mover is not None else ()
            finished = finished_runs(state, offset, moved, mapped)
            if guard is not None:
                mark = guard.stamp(offset, moved, clean=clean, finished=finished)
            else:
                mark = CommitMark(offset, moved, dirty=not clean, finished=finished)
            metadata, whole = fit(mark, self._limit)
            if not whole:
                self._metrics.map_cut += 1
                self._errors.warning(
                    "map", "the finished offsets above %s[%d]@%d do not fit in %d bytes of "
                    "commit metadata: those above the cut run again after a crash; raise "
                    "offset_metadata_max_bytes with the cluster's offset.metadata.max.bytes",
                    state.topic, state.partition, offset, self._limit,
                )  # fmt: skip
            if self._hold is not None:
                self._hold(state, self._over(state, mark, metadata, whole))
            offsets.append(TopicPartition(state.topic, state.partition, offset, metadata=metadata))
        return offsets

    def _over(self, state: PartitionState, mark: CommitMark, metadata: str, whole: bool) -> bool:
        """Whether ``state`` must take no new jobs until its map shrinks: its mark, counting
        only the offsets it was handed, is over :data:`HOLD_FRACTION` of the limit or cut.

        Offsets a previous owner finished or moved that were not fetched yet only go once they
        are fetched: held for them, the partition would never fetch them, and wait for ever.
        """
        if whole and len(metadata) <= self._hold_at:
            return False
        fetched = state.handed_next  # -1: nothing handed yet
        if (mark.finished and mark.finished[-1][1] > fetched) or (
            mark.moved and mark.moved[-1] >= fetched
        ):
            handed = replace(
                mark,
                moved=tuple(o for o in mark.moved if o < fetched),
                finished=offsetmap.clip(mark.finished, mark.offset, max(fetched, mark.offset)),
            )
            metadata, whole = fit(handed, self._limit)
        return not whole or len(metadata) > self._hold_at

    def commit(
        self,
        states: Iterable[PartitionState],
        now: float,
        *,
        sync: bool = False,
        finished: int | None = None,
        clean: bool = False,
    ) -> bool:
        """Commit the commit points of ``states`` (with the open transaction, if any).

        Returns whether everything is committed (an asynchronous commit counts as done); not
        if a partition was left out, its moves being in no transaction (see :meth:`offsets`).
        """
        if not (sync or clean) and self._mover is not None and self._mover.committing:
            return True  # due again at once, so made as soon as the one in flight has landed
        self._next = now + self._interval
        if finished is not None:
            self._finished_at_last = finished
        return self._send(list(states), sync=sync, clean=clean)

    def push(self, states: Iterable[PartitionState], *, sync: bool) -> bool:
        """Commit the marks of ``states`` now, moved or not, outside the schedule: a new owner's
        mark, a strike or a longer lease must be in Kafka before the jobs it covers run."""
        return self._send(list(states), sync=sync, force=True)

    def _send(
        self,
        states: list[PartitionState],
        *,
        sync: bool,
        clean: bool = False,
        force: bool = False,
    ) -> bool:
        assert self._consumer is not None
        mover = self._mover
        if mover is not None and mover.committing and not self._landed(mover, sync or clean):
            # Scheduled: the commit in flight answers first, the next one carries these offsets
            # and marks (a pushed mark too: its jobs wait for it a little longer). Else Kafka
            # aborted it (its moves are written again) or did not confirm it: commit later.
            return not (sync or clean)
        if mover is not None and mover.open:
            return self._commit_transaction(states, clean=clean, force=force, sync=sync)
        now = time.monotonic()
        if not (sync or clean or force) and self.awaiting(now):
            # See IN_FLIGHT_WAIT_S. Decided before the marks are made: making one records its
            # finished map and its lease as sent, and this commit is not.
            return True
        offsets = self.offsets(states, clean=clean, force=force)
        left = self._left_out(states, sync=sync, clean=clean)
        if not offsets:
            return not left
        if not sync:
            self._started.append(now)
            try:
                self._consumer.commit(offsets=offsets, asynchronous=True)
            except KafkaException as exc:
                self._started.pop()
                self._unmapped(offsets)
                self._metrics.count_commit("async", False, None, exc.args[0])
                self._errors.warning("commit", "offset commit failed: %s", exc)
            return not left
        return self._commit_now(offsets) and not left

    def _commit_now(self, offsets: list[TopicPartition]) -> bool:
        """A synchronous commit of ``offsets`` by the consumer; whether every one committed."""
        assert self._consumer is not None
        started = time.monotonic()
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._unmapped(offsets)
            self._metrics.count_commit("sync", False, time.monotonic() - started, exc.args[0])
            # Usually a rebalance in progress; the callers try again (at every turn of the
            # consumer thread while it lasts: one line in 10 s).
            self._errors.log(
                logging.INFO, "sync", "synchronous offset commit refused: %s", exc,
                extra={"offsets": describe(offsets)},
            )  # fmt: skip
            return False
        self._metrics.count_commit("sync", True, time.monotonic() - started)
        return self._record(result or [])

    @staticmethod
    def _landed(mover: Mover, wait: bool) -> bool:
        """Whether the commit in flight has landed (``wait``: waited for) and left no
        transaction open."""
        if not wait:
            return False
        mover.land()
        return not mover.open

    def _left_out(self, states: list[PartitionState], *, sync: bool, clean: bool) -> list[str]:
        """Those of ``states`` :meth:`offsets` left out: their moves are in no transaction."""
        stranded = self._mover.stranded() if self._mover is not None else set()
        left = [f"{s.topic}[{s.partition}]" for s in states if (s.topic, s.partition) in stranded]
        if left:
            self._errors.warning(f"stranded {sync} {clean}", "not committing %s: moves of its "
                "jobs are in no transaction (Kafka did not answer: they are written again first; "
                "or it failed for good: its jobs since its last commit run again)", ",".join(left)
            )  # fmt: skip
        return left

    def _commit_transaction(
        self, states: list[PartitionState], *, clean: bool, force: bool, sync: bool
    ) -> bool:
        """Commit the mover's transaction with the offsets of every owned partition it touched
        (they must ride along even when the watermark stands still) and of ``states``.

        ``clean`` holds for ``states`` only: the touched partitions are still ours and run on.
        Unless ``sync`` or ``clean``, the commit is made on the mover's helper thread
        (:mod:`.flight`) and counts as done, as an asynchronous one does.
        """
        assert self._consumer is not None
        assert self._mover is not None
        touched = set(self._mover.touched())
        chosen = {id(s) for s in states}
        riding = [
            state
            for state in self._states.values()
            if (state.topic, state.partition) in touched and id(state) not in chosen
        ]
        offsets = self.offsets(states, clean=clean, force=force)
        if riding:
            offsets += self.offsets(riding, force=force)
        started = time.monotonic()
        group_metadata = self._consumer.consumer_group_metadata()
        states_now = self._states

        def owned(where: tuple[str, int]) -> bool:
            return where in states_now

        def landed(committed: bool, ended_at: float | None = None) -> bool:
            ended = ended_at if ended_at is not None else time.monotonic()
            self._metrics.count_commit("transaction", committed, ended - started)
            if not committed:
                self._unmapped(offsets)
                return False
            self._metrics.count_transaction()
            return self._record(offsets)

        if not (sync or clean):
            self._mover.commit_async(offsets, group_metadata, owned, landed)
            return True
        return landed(self._mover.commit(offsets, group_metadata, owned))

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """librdkafka's callback for asynchronous commits (served by ``poll``, in order)."""
        started = self._started.popleft() if self._started else None
        seconds = time.monotonic() - started if started is not None else None
        self._metrics.count_commit("async", error is None, seconds, error)
        if error is not None:
            self._unmapped(partitions)
            self._errors.warning("commit", "offset commit failed: %s", error.str())
            return
        self._record(partitions)

    def _unmapped(self, partitions: Iterable[TopicPartition]) -> None:
        """Commits of ``partitions`` failed: their finished maps go with the next commit."""
        for tp in partitions:
            state = self._states.get((tp.topic, tp.partition))
            if state is not None:
                state.mapped = -1

    def _record(self, partitions: list[TopicPartition]) -> bool:
        ok = True
        for tp in partitions:
            if tp.error is not None:
                ok = False
                self._unmapped([tp])
                self._errors.warning(
                    "commit", "offset commit of %s[%d] failed: %s", tp.topic, tp.partition, tp.error
                )
                continue
            where = (tp.topic, tp.partition)
            state = self._states.get(where)
            if state is not None and tp.offset > state.committed:
                state.committed = tp.offset
            guard = self._guards.get(where)
            if guard is not None and tp.metadata:
                guard.acknowledged(promised(tp.offset, tp.metadata))
        return ok


def describe(partitions: Sequence[TopicPartition]) -> str:
    """``topic[partition@offset,...] ...`` for log lines, an offset only where one is known
    (an assignment carries none: librdkafka's ``OFFSET_INVALID``, -1001, would only be noise)."""
    by_topic: dict[str, list[str]] = {}
    for tp in partitions:
        known = tp.offset >= 0
        by_topic.setdefault(tp.topic, []).append(
            f"{tp.partition}@{tp.offset}" if known else str(tp.partition)
        )
    return ",".join(f"{topic}[{','.join(items)}]" for topic, items in by_topic.items())
