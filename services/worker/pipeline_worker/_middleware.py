"""The worker's extension point: middleware hooks that see the outcomes of jobs and the worker.

The runtime turns every message it takes into exactly one :class:`Outcome` (succeeded, failed,
timed out, undecodable, unknown type) and hands it to each middleware's :meth:`on_outcome`
*before* marking the message's offset finished. That is where failure routing plugs in (retry
topics, dead letters, lifecycle events): an ``on_outcome`` that returns an awaitable keeps the
offset unfinished until the awaitable is done, so a job is never committed before it was
moved.

Hooks run on the worker's event loop thread (``on_progress`` runs on the handler's thread,
``on_worker_stop`` on a thread of its own) and must not block it. A hook that raises is logged
and counted, never fatal to the worker. If ``on_outcome`` fails, the offset is *not* marked
finished: the partition's commit point stays before that job until the partition is revoked or
the worker restarts, and the job is delivered again then (at-least-once). A middleware that must
never hold a partition catches its own errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline._context import JobContext

    from ._runtime import Worker
    from .route.outcome import Outcome, PartitionRef


class Middleware:
    """Hooks into the worker. Every method here does nothing; override the ones you need."""

    def on_worker_start(self, worker: Worker) -> None:
        """The worker is about to join the consumer group."""

    def on_worker_stop(self, worker: Worker) -> None:
        """The worker stopped: its jobs are finished or abandoned, its offsets committed.

        Runs on a thread of its own (the middleware's hooks one after the other, in their
        order) for at most what is left of the stop's budget: one that takes longer is named in
        the log and left behind, and the worker exits."""

    def on_partitions_assigned(self, worker: Worker, partitions: Sequence[PartitionRef]) -> None:
        """The worker now owns ``partitions`` (before any of their jobs is taken)."""

    def on_partitions_revoked(
        self, worker: Worker, partitions: Sequence[PartitionRef], *, lost: bool
    ) -> None:
        """The worker gave up ``partitions`` (``lost``: taken away, their offsets not committed)."""

    def on_progress(self, context: JobContext, fraction: float, detail: str | None) -> None:
        """A handler called ``ctx.progress()``; runs on the handler's thread."""

    def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None:
        """A message ended; return an awaitable to keep its offset unfinished until it is done."""
        return None
