"""The event loop's side of failure routing: decide a move, hand it to the mover, which counts
it once its transaction commits."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pipeline._job import now_ms
from pipeline._ratelog import RateLimitedLog

from .._metrics import WorkerMetrics
from ..commit.moves import Mover
from .policy import Failure, FailurePolicy, Headers, Move, Record

if TYPE_CHECKING:
    from pipeline import Job

    from .._work import PartitionState

_log = logging.getLogger("pipeline.worker.failures")


class FailureRouter:
    """Routes each failed message once: retry tier, deferred, or dead letter."""

    def __init__(self, policy: FailurePolicy, mover: Mover, metrics: WorkerMetrics) -> None:
        self._policy = policy
        self._mover = mover
        self._metrics = metrics
        self._dead = RateLimitedLog(_log, interval_s=10.0)

    def route(
        self,
        failure: Failure,
        resolve: Callable[[bool], None],
        keys: Callable[[bool], Sequence[Record]] | None = None,
        state: PartitionState | None = None,
    ) -> None:
        """Move ``failure``; ``resolve(True)`` once the move is in the open transaction.

        ``state``: the assignment of the partition the move belongs to (see
        :meth:`..commit.moves.Mover.submit`).

        ``keys(dead)``: more records for the same transaction (the changelog of the job's
        idempotency key, which depends on whether the move is a dead letter).

        If no move can be made (a bug in encoding it), the offset stays unfinished
        (``resolve(False)``):
        the job runs again after the next rebalance or restart rather than being lost.
        """
        try:
            move = self._policy.decide(failure, now_ms())
        except Exception:
            _log.exception(
                "could not build the move of %s[%d]@%d; its offset stays unfinished",
                failure.topic,
                failure.partition,
                failure.offset,
            )
            resolve(False)
            return
        if move.dead:
            job = failure.job
            self._dead.warning(
                move.reason,
                "dead-lettering %s[%d]@%d (%s): %s",
                failure.topic,
                failure.partition,
                failure.offset,
                move.reason,
                failure.error,
                extra={"job_id": job.id if job is not None else None, "job_type": move.job_type},
            )
        count = functools.partial(self._metrics.count_move, move.job_type, move.dead, move.reason)
        self._submit(
            (failure.topic, failure.partition), failure.offset, move, resolve, keys, state, count
        )

    def defer(
        self,
        topic: str,
        partition: int,
        offset: int,
        job: Job,
        key: bytes | None,
        resolve: Callable[[bool], None],
        keys: Callable[[bool], Sequence[Record]] | None = None,
        state: PartitionState | None = None,
        headers: Headers = None,
    ) -> None:
        """Move a job that is not due for long to ``<ns>.deferred``, like :meth:`route`, with
        its message's ``headers``."""
        try:
            move = self._policy.defer(job, key, headers)
        except Exception:
            _log.exception("could not build the move of %s[%d]@%d; its offset stays unfinished",
                           topic, partition, offset)  # fmt: skip
            resolve(False)
            return
        count = functools.partial(self._metrics.count_move, move.job_type, False, move.reason)
        self._submit((topic, partition), offset, move, resolve, keys, state, count)

    def _submit(
        self,
        where: tuple[str, int],
        offset: int,
        move: Move,
        resolve: Callable[[bool], None],
        keys: Callable[[bool], Sequence[Record]] | None,
        state: PartitionState | None,
        count: Callable[[], object] | None = None,
    ) -> None:
        records: Sequence[Record] = move.records
        if keys is not None:
            records = [*records, *keys(move.dead)]
        self._mover.submit(where, offset, records, resolve, state=state, count=count)
