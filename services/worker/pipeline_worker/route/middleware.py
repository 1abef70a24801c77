"""The worker's extension point: outcomes of jobs, and middleware hooks that see them.

The runtime turns every message it takes into exactly one :class:`Outcome` (succeeded, failed,
timed out, undecodable, unknown type) and hands it to each middleware's :meth:`on_outcome`
*before* marking the message's offset finished. That is where failure routing plugs in (retry
topics, dead letters, lifecycle events): an ``on_outcome`` that returns an awaitable holds the
offset until the awaitable is done, so a job is never committed before it was moved.

Hooks run on the worker's event loop thread (``on_progress`` runs on the handler's thread) and
must not block it. A hook that raises is logged and counted, never fatal to the worker. If
``on_outcome`` fails, the offset is *not* marked finished: the partition's commit point stays
before that job until the partition is revoked or the worker restarts, and the job is delivered
again then (at-least-once). A middleware that must never hold a partition catches its own errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline import Job, JobType
    from pipeline._context import JobContext

    from .._runtime import Worker


class OutcomeKind(StrEnum):
    """How a message ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    """The handler raised, or the payload did not fit it (``PayloadValidationError``,
    ``DecodeError`` of the payload)."""
    TIMED_OUT = "timed_out"
    """The handler ran past the time limit (``error`` is a :class:`TimeLimitError`)."""
    UNDECODABLE = "undecodable"
    """The message is not a job envelope this worker can read (``error`` is a DecodeError)."""
    UNKNOWN_TYPE = "unknown_type"
    """A valid job whose type has no handler here (``error`` is an UnknownJobTypeError)."""
    POISON_PILL = "poison_pill"
    """Not run: it killed its worker process every time it ran alone on its partition
    (``error`` is a ``PoisonPillError``; ``job`` is None if the message cannot be decoded)."""


@dataclass(slots=True, kw_only=True)
class Outcome:
    """One message's result, as middleware sees it.

    ``job`` is ``None`` only when the message could not be decoded; ``raw`` and ``raw_headers``
    keep the message as it was for the two kinds that never ran (undecodable, unknown type), so
    it can be dead-lettered byte for byte. ``duration`` is the handler's run time in seconds.
    """

    kind: OutcomeKind
    topic: str
    partition: int
    offset: int
    key: bytes | None
    job: Job | None = None
    job_type: JobType | None = None
    error: BaseException | None = None
    duration: float = 0.0
    context: JobContext | None = None
    raw: bytes | None = None
    raw_headers: Sequence[tuple[str, str | bytes | None]] | None = None

    @property
    def ok(self) -> bool:
        return self.kind is OutcomeKind.SUCCEEDED


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """A partition of a priority topic, as hooks see assignment changes."""

    topic: str
    partition: int


class Middleware:
    """Hooks into the worker. Every method here does nothing; override the ones you need."""

    def on_worker_start(self, worker: Worker) -> None:
        """The worker is about to join the consumer group."""

    def on_worker_stop(self, worker: Worker) -> None:
        """The worker stopped: its jobs are finished or abandoned, its offsets committed."""

    def on_partitions_assigned(self, worker: Worker, partitions: Sequence[PartitionRef]) -> None:
        """The worker now owns ``partitions`` (before any of their jobs is taken)."""

    def on_partitions_revoked(
        self, worker: Worker, partitions: Sequence[PartitionRef], *, lost: bool
    ) -> None:
        """The worker gave up ``partitions`` (``lost``: taken away, their offsets not committed)."""

    def on_progress(self, context: JobContext, fraction: float, detail: str | None) -> None:
        """A handler called ``ctx.progress()``; runs on the handler's thread."""

    def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None:
        """A message ended; return an awaitable to hold its offset until it is done."""
        return None
