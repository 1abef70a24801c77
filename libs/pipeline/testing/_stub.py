"""The stub worker: runs what an application enqueued, in the test's process, on a fake clock.

While it runs, the application's enqueues go to an in-memory transport (its own transport is
swapped back afterwards). :meth:`StubWorker.drain` runs every job that is due, one at a time,
through :func:`~pipeline.testing._execution.execute` (the worker's codec, context,
interceptors, validation, time limit and failure classification), follows retries, and moves
the fake clock to the next due time (a delay, a ``not_before``, a retry's backoff) until no
job is left.

Order, as a worker sees it: a higher priority's due job runs before a lower one's; otherwise
jobs run in the order they reached their topic (so one key's jobs, all on one partition, run
in their enqueue order). A delayed job reaches its priority topic when it is due, as the
scheduler releases it; a retried job when its retry is due, as the retry relay returns it.
"""

from __future__ import annotations

import asyncio
import heapq
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._dedup import DedupPolicy, KeyOutcome, Verdict
from .._dedupstores import MemoryDedupStore
from .._errors import ConfigurationError, DecodeError
from .._eventloop import BoundedRunner
from .._job import Priority, now_ms
from ._clock import FakeClock
from ._execution import execute, off_the_loop
from ._results import JobResult, JobStatus
from ._transport import InMemoryTransport, SentMessage

if TYPE_CHECKING:
    from types import TracebackType

    from .._app import Pipeline
    from .._job import Job
    from .._producer import DeliveryCallback, Transport
    from .._registry import JobType

MAX_JOBS = 10_000
"""Runs one :meth:`StubWorker.drain` makes at most unless told (a job that enqueues itself
forever would never let it end)."""
_RANKS = {priority: rank for rank, priority in enumerate(Priority)}
_NOT_WRITTEN = -1
"""The offset of a retry waiting for its time: on its priority topic only once it arrives."""
_KEY_OUTCOMES = {
    JobStatus.SUCCEEDED: KeyOutcome.SUCCEEDED,
    JobStatus.RETRY: KeyOutcome.RETRYING,
    JobStatus.DEAD: KeyOutcome.DEAD,
}


@dataclass(slots=True)
class DrainReport:
    """What one :meth:`StubWorker.drain` ran, one :class:`JobResult` per attempt."""

    results: list[JobResult] = field(default_factory=list)
    """Every run, in run order."""
    deduplicated: list[Job] = field(default_factory=list)
    """Jobs acknowledged without running: another job held their idempotency key."""

    @property
    def succeeded(self) -> list[JobResult]:
        """The runs that succeeded (a job's last attempt)."""
        return [r for r in self.results if r.status is JobStatus.SUCCEEDED]

    @property
    def retried(self) -> list[JobResult]:
        """The runs that failed and were given another attempt."""
        return [r for r in self.results if r.status is JobStatus.RETRY]

    @property
    def dead(self) -> list[JobResult]:
        """The runs (and messages that never ran) that were dead-lettered."""
        return [r for r in self.results if r.status is JobStatus.DEAD]


class _StampedTransport(InMemoryTransport):
    """An in-memory transport that notes, for each message, where the fake clock stood and the
    wall clock's reading at the stub's last step: a due time the producer wrote on the wall
    clock counts from there on the fake one."""

    def __init__(self, clock: FakeClock, partitions: int) -> None:
        super().__init__(partitions)
        self._clock = clock
        self.anchor_ms = now_ms()
        """The wall clock's reading at the stub's last step (start, a run, the end of a drain):
        never later than the producer's reading of it for anything produced since."""
        self.stamps: dict[tuple[str, int, int], tuple[int, int, int]] = {}
        """Per message: the anchor, the fake clock, and the wall clock when it was written."""

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        super().produce(topic, value, key, on_delivery)
        sent = self._pending[-1][0]
        self.stamps[sent.topic, sent.partition, sent.offset] = (
            self.anchor_ms,
            self._clock.now_ms(),
            now_ms(),
        )

    def arrive(self, topic: str, partition: int, key: bytes | None, value: bytes) -> SentMessage:
        """A message written to ``topic`` by the worker's side (a delayed job the scheduler
        releases, a retry the relay returns), at the next offset of its partition."""
        offset = self._offsets[topic, partition]
        self._offsets[topic, partition] = offset + 1
        return SentMessage(topic, partition, offset, key, value)


class StubWorker:
    """Runs the jobs an application enqueues, while it is started (a context manager)."""

    def __init__(
        self,
        app: Pipeline,
        *,
        clock: FakeClock | None = None,
        fail_fast: bool = False,
        rand: random.Random | None = None,
        partitions: int | None = None,
    ) -> None:
        self.app = app
        self.clock = clock if clock is not None else FakeClock()
        self.fail_fast = fail_fast
        """Raise an error of a run (other than ``Retry``) from :meth:`drain` at once."""
        if partitions is None:  # as many as the application's topics have
            partitions = app.settings.topics.partitions
        self.transport = _StampedTransport(self.clock, partitions)
        """Where the application's enqueues go while the stub is started."""
        self._rand = rand if rand is not None else random.Random(0)
        self._ranks = {app.topics.jobs(p): rank for p, rank in _RANKS.items()}
        self._seen = 0
        self._seq = 0
        self._keys = MemoryDedupStore(scope=app.settings.worker.dedup_scope)
        """Idempotency keys, per partition, as the worker keeps them (on the fake clock)."""
        self._deduplicated: list[Job] = []
        self._ready: list[tuple[int, int, SentMessage]] = []
        """(priority rank, arrival, message): due jobs on their priority topic."""
        self._waiting: list[tuple[int, int, int, SentMessage]] = []
        """(due ms on the fake clock, arrival, priority rank, message): not due yet."""
        self._saved: Transport | None = None
        self._loop: BoundedRunner | None = None
        """The event loop the runs share while started, as a worker's jobs share one."""

    def __repr__(self) -> str:
        return (
            f"<StubWorker {len(self._ready)} ready, {len(self._waiting)} waiting at {self.clock}>"
        )

    # -- starting and stopping -----------------------------------------------------------------

    def start(self) -> StubWorker:
        """Send the application's enqueues to this stub (until :meth:`stop`)."""
        if self._saved is not None:
            raise ConfigurationError("this stub worker is started already")
        self._saved = self.app._transport
        self.app._transport = self.transport
        self.transport.anchor_ms = now_ms()
        self._loop = BoundedRunner()
        return self

    def stop(self) -> None:
        """Give the application its own transport back (jobs not run stay :meth:`pending`).

        What was enqueued to the stub is acknowledged, run or not (as ``run_job`` acknowledges
        what its run enqueued): the application's later ``flush()`` on its own transport waits
        for none of it. The runs' event loop is closed first: what a task cancelled then
        enqueues comes to the stub too."""
        loop, self._loop = self._loop, None
        try:
            if loop is not None:
                off_the_loop(loop.close)  # from an async test too
        finally:
            if self._saved is not None:
                self.app._transport, self._saved = self._saved, None
                self.transport.poll()

    def __enter__(self) -> StubWorker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- running -------------------------------------------------------------------------------

    def drain(self, *, until_ms: int | None = None, max_jobs: int = MAX_JOBS) -> DrainReport:
        """Run every job that is due, moving the clock to the next due time, until no job is
        left, the next one is due after ``until_ms`` (the clock then ends there), or
        ``max_jobs`` runs were made.

        Called from an ``async def`` test, it blocks the test's event loop until it returns (the
        jobs run on a loop of their own, on a helper thread): a handler that needs something
        living on the test's loop (a server, a client) takes :meth:`drain_async`."""
        if self._saved is None:
            raise ConfigurationError(
                "this stub worker is not started: drain() runs jobs only between start() and "
                "stop() (inside its with block), while what they enqueue comes back to it"
            )
        report = DrainReport()
        ran_out = self._drain(report, until_ms, max_jobs)
        if until_ms is not None and not ran_out:
            self.clock.advance_to_ms(until_ms)
        report.deduplicated, self._deduplicated = self._deduplicated, []
        self.transport.anchor_ms = now_ms()
        return report

    async def drain_async(
        self, *, until_ms: int | None = None, max_jobs: int = MAX_JOBS
    ) -> DrainReport:
        """:meth:`drain`, awaited from an ``async def`` test: it runs on a helper thread while the
        test's event loop goes on, so a handler can talk to a server or client on that loop."""
        return await asyncio.to_thread(self.drain, until_ms=until_ms, max_jobs=max_jobs)

    def _drain(self, report: DrainReport, until_ms: int | None, max_jobs: int) -> bool:
        """Run until done; True when out of runs (the clock stays where the last one ran)."""
        while len(report.results) < max_jobs:
            self._intake()
            self._release(self.clock.now_ms())
            if self._ready:
                self._run(heapq.heappop(self._ready)[2], report)
                continue
            if not self._waiting:
                return False
            due = self._waiting[0][0]
            if until_ms is not None and due > until_ms:
                return False
            self.clock.advance_to_ms(due)
        return True

    def pending(self) -> list[Job]:
        """The jobs not run yet (due ones first, then by due time); undecodable ones left out.
        After :meth:`stop` too: the jobs left in the stub."""
        self._intake()
        messages = [m for _, _, m in sorted(self._ready)]
        messages += [m for _, _, _, m in sorted(self._waiting)]
        jobs = []
        for message in messages:
            try:
                jobs.append(self.app.codec.decode(message.value))
            except DecodeError:
                continue
        return jobs

    def _run(self, message: SentMessage, report: DrainReport) -> None:
        self.transport.anchor_ms = now_ms()
        execution = execute(
            self.app,
            message,
            clock=self.clock.now_ms,
            rand=self._rand,
            fail_fast=self.fail_fast,
            loop=self._loop,
        )
        result = execution.result
        report.results.append(result)
        if result.job is not None and result.job.idempotency_key is not None:
            self._settle(message, result)
        retry = execution.retry
        if retry is not None and result.retry_at_ms is not None:
            # Back on its priority topic when due, as the retry relay returns it (its offset
            # there is given when it arrives: see _release).
            topic = self.app.topics.jobs(retry.priority)
            again = SentMessage(
                topic, message.partition, _NOT_WRITTEN, message.key, self.app.codec.encode(retry)
            )
            self._wait(result.retry_at_ms, _RANKS[retry.priority], again)

    # -- arrivals ------------------------------------------------------------------------------

    def _intake(self) -> None:
        """Take what the application produced since the last look."""
        self.transport.poll()
        messages = self.transport.messages
        deferred = self.app.topics.deferred
        while self._seen < len(messages):
            message = messages[self._seen]
            self._seen += 1
            rank = self._ranks.get(message.topic)
            if rank is None and message.topic != deferred:
                continue  # not a job topic a worker consumes
            job = self._peek(message)  # None: runs at once, and is dead-lettered
            wall_ms, fake_ms, written_ms = self.transport.stamps[
                message.topic, message.partition, message.offset
            ]
            # A job due when it was written to its priority topic (its due time rounds up to
            # the next millisecond: `delay=0`) runs in its offset's order, behind the jobs of
            # its key written before it, as the worker reads it; one on the deferred topic, or
            # not due yet, waits for its time.
            not_before = job.not_before if job is not None else None
            if (
                job is not None
                and not_before is not None
                and (rank is None or not_before > written_ms + 1)
            ):
                self._wait(fake_ms + not_before - wall_ms, _RANKS[job.priority], message)
                continue
            rank = rank if rank is not None else _RANKS[Priority.DEFAULT]
            # A worker reads it (and checks its key) as it is written: at its fake write time.
            self._arrive(rank, message, job, fake_ms)

    def _wait(self, due_ms: int, rank: int, message: SentMessage) -> None:
        self._seq += 1
        heapq.heappush(self._waiting, (due_ms, self._seq, rank, message))

    def _arrive(self, rank: int, message: SentMessage, job: Job | None, at_ms: int) -> None:
        """``message`` reached its priority topic at ``at_ms`` (fake): queued, unless a
        duplicate of a key held then."""
        if (
            job is not None
            and job.idempotency_key is not None
            and not self._admit(message, job, at_ms)
        ):
            self._deduplicated.append(job)
            return
        self._seq += 1
        heapq.heappush(self._ready, (rank, self._seq, message))

    def _release(self, now_ms: int) -> None:
        """Jobs whose time came reach their priority topic, in due order."""
        waiting = self._waiting
        while waiting and waiting[0][0] <= now_ms:
            _, _, rank, message = heapq.heappop(waiting)
            if message.topic == self.app.topics.deferred or message.offset == _NOT_WRITTEN:
                message = self.transport.arrive(
                    self._topic_of(rank), message.partition, message.key, message.value
                )
            self._arrive(rank, message, self._peek(message), now_ms)

    def _peek(self, message: SentMessage) -> Job | None:
        try:
            return self.app.codec.decode(message.value)
        except DecodeError:
            return None

    # -- idempotency keys ----------------------------------------------------------------------

    def _admit(self, message: SentMessage, job: Job, at_ms: int) -> bool:
        """Whether a job with an idempotency key runs, as the worker's intake decides it when
        it reads it, at ``at_ms``."""
        job_type = self.app.registry.find(job.type)
        if job_type is None:
            return True  # it is dead-lettered as of an unknown type
        verdict = self._keys.check(
            (message.topic, message.partition),
            job.idempotency_key or "",
            job.id,
            policy=self._policy(job_type),
            now_ms=at_ms,
        )
        return verdict is Verdict.RUN or verdict is Verdict.RETRY

    def _settle(self, message: SentMessage, result: JobResult) -> None:
        job = result.job
        assert job is not None
        job_type = self.app.registry.find(job.type)
        if job_type is None:
            return
        self._keys.settle(
            (message.topic, message.partition),
            job.idempotency_key or "",
            job.id,
            _KEY_OUTCOMES[result.status],
            policy=self._policy(job_type),
            now_ms=self.clock.now_ms(),
        )

    def _policy(self, job_type: JobType) -> DedupPolicy:
        return job_type.options.dedup_policy(self.app.settings.worker.dedup_ttl_s)

    def _topic_of(self, rank: int) -> str:
        return self.app.topics.jobs(list(Priority)[rank])


@contextmanager
def stub_worker(
    app: Pipeline,
    *,
    clock: FakeClock | None = None,
    fail_fast: bool = False,
    rand: random.Random | None = None,
) -> Iterator[StubWorker]:
    """``with stub_worker(app) as worker:`` the application's enqueues go to ``worker``, which
    runs them on :meth:`StubWorker.drain`; its own transport is back after the block."""
    with StubWorker(app, clock=clock, fail_fast=fail_fast, rand=rand) as worker:
        yield worker
