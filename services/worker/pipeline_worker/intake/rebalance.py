"""Rebalances: what the consumer thread does when the group assigns, revokes or loses partitions.

librdkafka calls these from inside ``poll`` on the consumer thread. An incremental protocol
(the consumer protocol of KIP-848, classic cooperative-sticky) names only the partitions that
move; an eager one (classic range) revokes everything and assigns the whole new assignment.

A revoked partition stays in the table until the loop has finished or given up its running jobs
(``revoke_grace_s``) and their moves are written, then its watermark is committed and it is
unassigned; a lost one (the session expired: another member may own it already) is dropped at
once and nothing of it is committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline._errors import TransactionError, TransactionFencedError

from .._work import PartitionState
from ..commit.committer import describe

if TYPE_CHECKING:
    from confluent_kafka import Consumer, TopicPartition

    from pipeline import Priority

    from .._metrics import WorkerMetrics
    from ..commit.committer import Committer
    from ..commit.moves import Mover
    from ..recovery.poison import PoisonWatch
    from .assignment import Assignment
    from .cluster import ClusterView
    from .flow import FlowControl
    from .loopside import LoopSide

_log = logging.getLogger("pipeline.worker.consumer")


class Rebalance:
    """The consumer's rebalance callbacks, on the partition table the thread shares with them."""

    def __init__(
        self,
        *,
        topics: dict[str, tuple[Priority, int]],
        states: dict[tuple[str, int], PartitionState],
        side: LoopSide,
        metrics: WorkerMetrics,
        flow: FlowControl,
        assignment: Assignment,
        cluster: ClusterView,
        committer: Committer,
        poison: PoisonWatch,
        mover: Mover | None,
        grace_s: float,
        txn_commit_after_s: float,
        incremental: bool,
        drain_moves: Callable[[], None],
        notify: Callable[..., None],
    ) -> None:
        self._topics = topics
        self.states = states
        self._side = side
        self._metrics = metrics
        self._flow = flow
        self.assignment = assignment
        self._cluster = cluster
        self._committer = committer
        self._poison = poison
        self._mover = mover
        self._grace_s = grace_s
        self._txn_commit_after_s = txn_commit_after_s
        """How old the moves' transaction may grow while a revocation waits before it is
        committed (half the transaction timeout: Kafka fences a producer whose transaction
        outlives it)."""
        self._incremental = incremental
        self._drain_moves = drain_moves
        self._notify = notify
        self.assigned_once = False
        """Whether the group assigned this member anything yet, an empty assignment included (a
        burst run waits for it)."""
        self.closing = False
        """Set when the consumer closes: the revocation of everything is not logged or counted."""

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        new = []
        for tp in partitions:
            known = self._topics.get(tp.topic)
            if known is None:
                continue
            priority, pidx = known
            state = PartitionState(tp.topic, tp.partition, priority, pidx)
            self.states[(state.topic, state.partition)] = state
            new.append(state)
        if self._incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        if partitions:
            # librdkafka keeps a partition's pause flag across a revoke and a new assignment, so
            # a partition we paused before losing it would come back paused: resume it once its
            # commit mark is read (after this callback: no blocking call may happen inside it).
            consumer.pause(partitions)
            for state in new:
                state.paused = True
            self.assignment.add(new)
            self._metrics.count(self._metrics.rebalances, "assign")
            _log.info(
                "partitions assigned",
                extra={"partitions": describe(partitions), "owned": len(self.states)},
            )
        self.assigned_once = True
        self._cluster.share_changed = True
        self._notify(self._side.on_assigned, new)

    def joined_empty(self) -> None:
        """The group took this member in with no partition, and no callback said so (see
        :class:`.burst.EmptyJoin`): as ``on_assign`` with nothing."""
        _log.info("joined the group with no partition")
        self.assigned_once = True
        self._cluster.share_changed = True

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._committer.without_positions():  # see there: called inside consume()
            self._give_up(consumer, partitions, lost=False)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._committer.without_positions():
            self._give_up(consumer, partitions, lost=True)

    def _give_up(self, consumer: Consumer, partitions: list[TopicPartition], *, lost: bool) -> None:
        if self._mover is not None:
            # A commit in flight is settled while its partitions are in the table: an abort
            # writes their moves again (a partition out of it would lose its moves).
            self._mover.land()
        states = []
        for tp in partitions:
            state = self.states.get((tp.topic, tp.partition))
            if state is not None:
                states.append(state)
                self._flow.forget(state)
        if lost:
            for state in states:
                del self.states[(state.topic, state.partition)]
            if self._mover is not None:
                # Not ours any more: moves of theirs in the open transaction must not commit,
                # not even with a commit made while the loss waits for their jobs.
                self._mover.forget((s.topic, s.partition) for s in states)
        self.assignment.discard(states)
        if states and not self.closing:
            self._metrics.count(self._metrics.rebalances, "lost" if lost else "revoke")
            _log.info(
                "partitions lost" if lost else "partitions revoked",
                extra={"partitions": describe(partitions), "owned": len(self.states)},
            )
            self._wait_for_jobs(states, lost=lost)
            self._cluster.share_changed = True
        if not lost:
            # Kept in the table while their jobs finished, so that their moves were written.
            for state in states:
                del self.states[(state.topic, state.partition)]
        if states and not lost:
            # Still ours until incremental_unassign, and this is the one moment of a rebalance
            # when the group generation is settled: commit their watermarks now (also when
            # closing, in case the final commit met a rebalance in progress and was refused).
            # Not a synchronous commit: a blocking consumer call inside a rebalance callback
            # breaks confluent-kafka's per-thread call state (a later callback of the same poll
            # then aborts the process). The commit is queued before the unassignment and the
            # rejoin, so the coordinator handles it first; close() waits for it.
            self._committer.commit(states, time.monotonic(), clean=True)
            if self._mover is not None:
                self._mover.forget((s.topic, s.partition) for s in states)
        self._forget(states)
        self._unassign(consumer, partitions)

    def _wait_for_jobs(self, states: list[PartitionState], *, lost: bool) -> None:
        """The loop stops dispatching ``states``, drops their buffered jobs and waits up to the
        grace period for their running jobs; polling waits meanwhile (well within
        max.poll.interval.ms), which keeps the assignment steady while we finish."""
        future = asyncio.run_coroutine_threadsafe(
            self._side.revoke(states, lost=lost), self._side.loop
        )
        deadline = time.monotonic() + self._grace_s + 5.0
        committer = self._committer
        try:
            # Keep writing the moves of the jobs we wait for: they finish only then. Not while
            # an asynchronous commit is unanswered (the rule of the steady state, see
            # Committer.awaiting): no poll answers it in here, so the moves wait up to
            # IN_FLIGHT_WAIT_S; those still queued at the end are not ours to write.
            while not future.done() and time.monotonic() < deadline:
                if committer.in_transaction or not committer.awaiting(time.monotonic()):
                    self._drain_moves()
                self._commit_if_old(time.monotonic())
                with contextlib.suppress(TimeoutError):
                    future.result(timeout=0.02)
            future.result(timeout=0)
        except Exception as exc:
            # Handed over all the same (the loop is blocked, or its revoke failed): the jobs
            # still running are given up now, as the loop's revoke does at the end of the grace
            # period, so that none of them is moved or settles its key later, perhaps into the
            # partition's next assignment (Endings, Mover._write).
            for state in states:
                state.released = True
            if isinstance(exc, (TransactionError, TransactionFencedError)):
                raise  # the moves' producer failed for good: the consumer thread stops
            _log.error("waiting for the jobs of revoked partitions failed: %s", exc)

    def _commit_if_old(self, now: float) -> None:
        """Commit the moves' transaction once it is old. Polling waits while a revocation
        waits for its jobs, and so do the commits made between polls: the moves of the jobs that
        fail meanwhile would keep one transaction open for the whole grace period, and Kafka
        aborts a transaction older than its timeout and fences its producer for good (a new
        producer would write its moves again)."""
        mover = self._mover
        if mover is None or mover.open_for(now) < self._txn_commit_after_s:
            return
        age = mover.open_for(now)
        if self._committer.commit((), now, sync=True):  # not in flight: it is landed here
            _log.info("moves committed while a revocation waits", extra={"age_s": round(age, 3)})

    def _unassign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._incremental:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()  # eager: everything was revoked

    def _forget(self, states: list[PartitionState]) -> None:
        """Drop what the thread keeps of partitions that are not ours any more."""
        self._poison.forget(states)
        self.assignment.unload(states)
