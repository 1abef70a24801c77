"""The job context: what a running handler may know about its job (``ctx``).

A handler receives it when it declares a ``ctx`` parameter::

    @app.job("report.build", time_limit=60)
    async def build(report_id: int, ctx: JobContext) -> None:
        ctx.progress(0.5, "half way")
        if (ctx.time_left() or 60) < 5: ...

The worker builds one per run; handlers can also build one in their own tests with
``JobContext(job)``. Nothing here talks to Kafka.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ._failures import attempt_limit

if TYPE_CHECKING:
    from ._job import Job, Priority
    from ._registry import JobType

ProgressCallback = Callable[["JobContext", float, "str | None"], None]
"""Called by :meth:`JobContext.progress` with the context, the fraction and the detail."""


class JobContext:
    """One run of a job: its identity, where it came from, its deadline and a progress callback.

    ``deadline`` is in :func:`time.monotonic` seconds (``None``: no time limit). ``key`` is the
    Kafka message key. ``topic``/``partition``/``offset`` locate the message the job came from.
    """

    __slots__ = (
        "_job_type",
        "_on_progress",
        "deadline",
        "job",
        "key",
        "offset",
        "partition",
        "progress_detail",
        "progress_fraction",
        "topic",
    )

    def __init__(
        self,
        job: Job,
        *,
        topic: str = "",
        partition: int = -1,
        offset: int = -1,
        key: bytes | None = None,
        deadline: float | None = None,
        on_progress: ProgressCallback | None = None,
        job_type: JobType | None = None,
    ) -> None:
        """``job_type``: the registered type whose ``max_attempts`` holds too (None: only the
        envelope's)."""
        self.job = job
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.deadline = deadline
        self.progress_fraction: float | None = None
        self.progress_detail: str | None = None
        self._on_progress = on_progress
        self._job_type = job_type

    def __repr__(self) -> str:
        return (
            f"JobContext(id={self.id!r}, type={self.type!r}, attempt={self.attempt}, "
            f"topic={self.topic!r}, partition={self.partition}, offset={self.offset})"
        )

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def type(self) -> str:
        return self.job.type

    @property
    def attempt(self) -> int:
        """1 on the first run; each retry adds one."""
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        """The runs the job may have in all: the smaller of its envelope's ``max_attempts``
        and its type's (a producer that does not know the type writes the default, 5): the
        limit the worker applies (computed when asked, not for every run)."""
        return attempt_limit(self.job, self._job_type)

    @property
    def priority(self) -> Priority:
        return self.job.priority

    @property
    def idempotency_key(self) -> str | None:
        return self.job.idempotency_key

    @property
    def tenant(self) -> str | None:
        return self.job.tenant

    @property
    def headers(self) -> Mapping[str, str]:
        """The job's headers (e.g. W3C ``traceparent``); read them, do not change them."""
        return self.job.headers

    @property
    def is_last_attempt(self) -> bool:
        """Whether a failure of this run dead-letters the job instead of retrying it."""
        return self.job.attempt >= self.max_attempts

    def time_left(self) -> float | None:
        """Seconds until the time limit (never negative), or ``None`` without a time limit."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def progress(self, fraction: float, detail: str | None = None) -> None:
        """Report how far the job got (``0.0`` to ``1.0``), with an optional short detail.

        Safe to call often and from the handler's own thread; the worker records it (and, with
        lifecycle events on, publishes it).
        """
        if not isinstance(fraction, int | float) or math.isnan(fraction):
            raise ValueError(f"progress must be a number between 0 and 1, got {fraction!r}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"progress must be between 0 and 1, got {fraction}")
        self.progress_fraction = float(fraction)
        self.progress_detail = detail
        if self._on_progress is not None:
            self._on_progress(self, float(fraction), detail)
