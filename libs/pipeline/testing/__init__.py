"""A test kit for applications built on ``pipeline``: no Kafka needed (docs/testing.md).

- :class:`InMemoryTransport` stands in for the Kafka producer, so a test can check what an
  application enqueues (keyed messages land on the partition Kafka's partitioner picks).
- :func:`run_job` runs one job the way the worker runs it (codec, context, interceptors,
  payload validation, time limit, ``Retry``/fatal classification) and returns a
  :class:`JobResult` (:func:`run_job_async` from an ``async def`` test).
- :class:`StubWorker` (:func:`stub_worker`) runs what an application enqueues, one job at a
  time, following delays and retries on a :class:`FakeClock`, a clock that moves only when
  told; :meth:`StubWorker.drain` (``await`` :meth:`StubWorker.drain_async`) returns a
  :class:`DrainReport`.
"""

from .._records import DeadLetterReason
from ._clock import FakeClock
from ._results import JobResult, JobStatus
from ._runjob import run_job, run_job_async
from ._stub import DrainReport, StubWorker, stub_worker
from ._transport import InMemoryTransport, SentMessage

__all__ = [
    "DeadLetterReason",
    "DrainReport",
    "FakeClock",
    "InMemoryTransport",
    "JobResult",
    "JobStatus",
    "SentMessage",
    "StubWorker",
    "run_job",
    "run_job_async",
    "stub_worker",
]
