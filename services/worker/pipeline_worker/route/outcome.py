"""How a message ended (:class:`Outcome`), and the hooks the job path calls with it.

The runtime turns every message it takes into exactly one :class:`Outcome` and hands it to each
hook's ``on_outcome`` before marking the message's offset finished (see
:class:`pipeline_worker.Middleware`, the public base class, for what the hooks may do). The job
path needs only :class:`JobHooks`, the per-job half of a middleware, so this stage knows
nothing of the worker that wires it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pipeline import Job, JobType
    from pipeline._context import JobContext


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


class JobHooks(Protocol):
    """The per-job hooks of a middleware: what the job path calls (on the event loop thread,
    ``on_progress`` on the handler's thread)."""

    def on_progress(self, context: JobContext, fraction: float, detail: str | None) -> None: ...

    def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None: ...
