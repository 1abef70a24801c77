"""What one run of a job came to, as ``run_job`` and the stub worker tell it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._job import Job
    from .._records import DeadLetterReason


class JobStatus(StrEnum):
    """How a run ended: the job succeeded, runs again later, or was dead-lettered."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"
    DEAD = "dead"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """One run of a job and what the worker would do next."""

    status: JobStatus
    job: Job | None
    """The decoded job that ran (None only for a message that could not be decoded)."""
    attempt: int
    """The attempt that ran (1-based; 0 when the message could not be decoded)."""
    value: Any = None
    """What the handler returned (``SUCCEEDED``)."""
    error: BaseException | None = None
    """What the run raised (its handler, an interceptor, the payload check, the time limit)."""
    retry_at_ms: int | None = None
    """``RETRY``: when the next attempt is due, in epoch ms (on the clock the run was given)."""
    retry_in_s: float | None = None
    """``RETRY``: seconds from the start of this run to :attr:`retry_at_ms`."""
    reason: DeadLetterReason | None = None
    """``DEAD``: the reason the worker writes on the dead letter (``max_attempts``...)."""
    enqueued: tuple[Job, ...] = ()
    """``run_job``: the jobs the run enqueued (kept in the test, never sent), in order."""

    @property
    def job_type(self) -> str | None:
        """The job's type name (None for an undecodable message)."""
        return self.job.type if self.job is not None else None

    def __repr__(self) -> str:
        detail = {
            JobStatus.SUCCEEDED: f"value={self.value!r}",
            JobStatus.RETRY: f"retry_in_s={self.retry_in_s!r}, error={self.error!r}",
            JobStatus.DEAD: f"reason={self.reason!s}, error={self.error!r}",
        }[self.status]
        return f"<JobResult {self.job_type} attempt {self.attempt} {self.status}: {detail}>"
