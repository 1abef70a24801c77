"""A consumed batch into queued work: the first step of the event loop's job path.

Each message of an owned partition is decoded into a :class:`Work` in its priority's queue, or
ends without running (undecodable, of an unknown type, a duplicate idempotency key, finished
by a previous owner) through :mod:`..route.endings`. One call per batch, none per message: the
per-message loop is the hot path's first half (the :class:`..execute.processor.Processor`
starts what it queued).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .._work import PartitionState, Work
from ..route.endings import Endings, decode_error
from ..route.outcome import OutcomeKind

if TYPE_CHECKING:
    from confluent_kafka import Message

    from pipeline import Pipeline

    from .._metrics import WorkerMetrics
    from ..commit.offsetmap import Skips
    from ..dispatch.dispatcher import WorkQueue
    from ..dispatch.jobtypes import TypeTable
    from ..dispatch.tenants import TenantTable
    from ..route.dedup import Deduplicator

_log = logging.getLogger("pipeline.worker.commits")


class BatchDecoder:
    """Messages of owned partitions, from a handed batch into the dispatcher's queues."""

    def __init__(
        self,
        *,
        app: Pipeline,
        types: TypeTable,
        queues: list[WorkQueue],
        tenants: TenantTable,
        endings: Endings,
        metrics: WorkerMetrics,
        dedup: Deduplicator | None,
    ) -> None:
        self._app = app
        self._types = types
        self._queues = queues
        self._tenants = tenants
        self._endings = endings
        self._metrics = metrics
        self._dedup = dedup

    def queue(self, batch: list[tuple[PartitionState, list[Message]]]) -> None:
        """Queue the jobs of ``batch`` (partitions revoked meanwhile are passed over)."""
        decode = self._app.codec.decode  # looked up per batch: the application's codec
        entries = self._types.entries.get  # the types met already: one lookup, no call
        find = self._types.find
        dedup = self._dedup
        endings = self._endings
        queues = self._queues
        tenants = self._tenants.active
        for state, messages in batch:
            if not state.active:
                continue
            tracker = state.tracker
            expected = state.expected
            queue = queues[state.pidx]
            pidx = state.pidx
            skips = state.skips if expected >= 0 else _first(state, messages[0])
            queued: list[Work] = []
            for msg in messages:
                offset: int = msg.offset()  # type: ignore[assignment]
                if offset < expected:
                    # Delivered again within one assignment (e.g. by a resume racing a fetch):
                    # it is buffered or done already.
                    state.taken += 1
                    self._metrics.duplicates += 1
                    continue
                expected = offset + 1
                tracker.add(offset)
                if skips is not None and skips.covers(offset):
                    # Finished by a previous owner (ran, or was moved in a committed transaction).
                    state.taken += 1
                    self._metrics.skipped_finished += 1
                    endings.done(state, offset, True)
                    continue
                try:
                    job = decode(msg.value())  # type: ignore[arg-type]
                except Exception as exc:  # DecodeError; anything else is a codec bug
                    state.expected = expected
                    endings.skip(state, msg, OutcomeKind.UNDECODABLE, decode_error(exc, msg), None)
                    continue
                entry = entries(job.type) or find(job.type)
                if entry is None:
                    state.expected = expected
                    endings.skip(state, msg, OutcomeKind.UNKNOWN_TYPE, None, job)
                    continue
                if (
                    dedup is not None
                    and job.idempotency_key is not None
                    and not endings.admit(dedup, state, job, entry.job_type, msg.key())
                ):
                    state.taken += 1
                    endings.done(state, offset, True)
                    continue
                work = Work(state, offset, msg.key(), job, entry.job_type, entry.limit,
                            entry.stats[pidx], msg.headers())  # type: ignore[arg-type]  # fmt: skip
                queued.append(work)
            state.expected = expected
            if queued:
                if tenants:
                    self._tenants.tag(queued)
                queue.extend(queued)  # one call per partition, none per job

    def poison(self, state: PartitionState, msg: Message, error: BaseException) -> None:
        """Dead-letter, without running it, a message that killed its worker process every time
        it ran alone (see :mod:`..recovery.poison`); its offset is finished once the move is
        made. Dropped, as a batch of a revoked partition is, if it is not the next one."""
        offset: int = msg.offset()  # type: ignore[assignment]
        if not state.active or offset < state.expected:
            state.taken += 1  # not finished, so delivered again
            return
        if state.expected < 0:
            _first(state, msg)
        state.expected = offset + 1
        state.tracker.add(offset)
        state.taken += 1
        try:
            job = self._app.codec.decode(msg.value())  # type: ignore[arg-type]
        except Exception:
            job = None  # dead-lettered with its raw bytes
        self._endings.end_unrun(state, msg, OutcomeKind.POISON_PILL, error, job, offset)


def _first(state: PartitionState, msg: Message) -> Skips | None:
    """The skips of ``state``, whose first message of this assignment is ``msg``: none if its
    offset is below the committed offset. Consumption did not start where the mark was written
    then (the committed offset was out of range, and ``auto.offset.reset`` went back to the
    start of the log: truncated by an unclean leader election, or a topic created again), so
    the offsets the mark lists as finished may be other messages now."""
    offset: int = msg.offset()  # type: ignore[assignment]
    if state.skips is not None and offset < state.committed:
        _log.warning(
            "%s[%d] is consumed from offset %d, below its committed offset %d (out of range): "
            "the offsets its commit listed as finished run again",
            state.topic, state.partition, offset, state.committed,
        )  # fmt: skip
        state.skips = None
    return state.skips
