"""The two records the runtime moves around: an owned partition and a job taken from it.

Both are plain slotted objects: one ``Work`` is made per job on the hot path, so it must be
cheap. A ``PartitionState`` is shared by the consumer thread and the event loop thread without
locks: every field has a single writer (noted below), and readers on the other thread only need
a recent value (ints and bools are replaced atomically under the GIL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipeline._context import JobContext

from .commit.offsetmap import Runs, Skips
from .commit.offsets import OffsetTracker

if TYPE_CHECKING:
    from asyncio import Task, TimerHandle
    from collections import deque
    from contextvars import Context

    from pipeline import Job, JobType, Priority
    from pipeline._context import ProgressCallback
    from pipeline._followups import FollowUps

    from ._metrics import TenantStats, TypeStats
    from .dispatch.limits import TypeLimit
    from .route.policy import Headers


class PartitionState:
    """One assigned partition of a priority topic, from assignment until revocation."""

    __slots__ = (
        "active",
        "at_end",
        "commit_offset",
        "committed",
        "expected",
        "handed",
        "handed_next",
        "in_flight",
        "keys",
        "map_next",
        "map_runs",
        "mapped",
        "partition",
        "paused",
        "pidx",
        "priority",
        "read_back",
        "released",
        "skips",
        "started_next",
        "taken",
        "topic",
        "tracker",
    )

    def __init__(self, topic: str, partition: int, priority: Priority, pidx: int) -> None:
        self.topic = topic
        self.partition = partition
        self.priority = priority
        self.pidx = pidx
        """Index of the priority in the worker's priority order (its dispatcher queue)."""
        self.active = True
        """False once revoked or lost (loop thread writes)."""
        self.released = False
        """True once the revocation is over (its grace period waited for the running jobs):
        a job of this partition that ends later was given up, and the partition's next owner,
        perhaps this worker again, runs it again. Loop thread; the consumer thread sets it too
        when it hands the partition over without the loop's word (the revocation's wait gave
        up), and moves of this assignment are not written from then on (see ..commit.moves)."""
        # Consumer thread writes: messages handed to the loop, one past the last handed offset,
        # and whether the partition is paused. Loop thread writes: messages taken out of the
        # buffer (started, skipped or dropped), so handed - taken is what the buffer holds.
        self.handed = 0
        self.handed_next = -1
        self.paused = False
        self.at_end = False
        """Consumed to the end (an end-of-partition event came after the last message)."""
        self.read_back = False
        """What a previous owner left is read back, and the partition may fetch (the messages
        delivered before its pause, held until then, are handed right after, before any
        commit): only then may a commit be the consumer's position (..commit.committer)."""
        self.taken = 0
        # Loop thread: next offset expected from the consumer (-1: any), finished offsets and
        # the commit point they allow; the consumer thread reads commit_offset to commit it.
        self.expected = -1
        self.tracker = OffsetTracker()
        self.commit_offset = -1
        self.in_flight = 0
        self.keys: dict[bytes, deque[Work] | None] = {}
        """Per-key ordering: a key present has a job admitted; the deque holds its successors."""
        # Consumer thread: the last offset the broker acknowledged as committed.
        self.committed = -1
        self.mapped = -1
        """``tracker.finished_count`` when the finished map was last read from the tracker
        (-1: never, or its commit failed): a commit is due when the count changed. Consumer
        thread, as the two below: the runs read then, and when the tracker may be read again."""
        self.map_runs: Runs = ()
        self.map_next = 0.0
        self.skips: Skips | None = None
        """Offsets a previous owner finished (from the commit metadata; the consumer thread sets
        it before the partition is resumed, then the loop thread passes them over and the
        consumer thread reads what is left for its commits)."""
        self.started_next = -1
        """One past the last offset handed to a handler (loop thread), for the commit mark."""

    @property
    def buffered(self) -> int:
        return self.handed - self.taken

    def __repr__(self) -> str:
        return f"<partition {self.topic}[{self.partition}]>"


class Work:
    """One job taken from a partition, from decoding until its offset is finished."""

    __slots__ = (
        "context",
        "ctx",
        "expired",
        "finished",
        "follow_ups",
        "given_up",
        "headers",
        "job",
        "job_type",
        "key",
        "kwargs",
        "limit",
        "offset",
        "runner",
        "slot_freed",
        "started",
        "state",
        "stats",
        "suspended",
        "tenant_limit",
        "tenant_stats",
        "timer",
    )

    def __init__(
        self,
        state: PartitionState,
        offset: int,
        key: bytes | None,
        job: Job,
        job_type: JobType,
        limit: TypeLimit[Work] | None,
        stats: TypeStats,
        headers: Headers = None,
    ) -> None:
        self.state = state
        self.offset = offset
        self.key = key
        self.headers = headers
        """Its message's Kafka headers, which its moves (retry, deferral) carry on."""
        self.job = job
        self.job_type = job_type
        self.limit = limit
        self.stats = stats
        self.tenant_limit: TypeLimit[Work] | None = None
        """Its tenant's cap and rate, when the settings give the tenant any."""
        self.tenant_stats: TenantStats | None = None
        """Its tenant's counters, when the settings name tenants."""
        self.kwargs: dict[str, Any] | None = None
        self.ctx: JobContext | None = None
        self.context: Context | None = None
        """The interceptor chain's context, for a plain function run on the pool under it (so
        that what the chain set, such as the current span, holds in the handler too)."""
        self.started = 0.0
        self.timer: TimerHandle | None = None
        self.runner: Task[None] | None = None
        self.suspended = False
        self.expired = False
        self.finished = False
        self.given_up = False
        """Under interceptors, its plain function was given up before a pool thread took it
        (:data:`~.execute.runners.GIVEN_UP`): its chain's end is that of a job never run."""
        self.follow_ups: FollowUps | None = None
        """The jobs its handler enqueued, from the first on (see :mod:`pipeline._followups`)."""
        self.slot_freed = False
        """Its handler returned and its concurrency slot, key and caps are free, while its end
        waits for Kafka's answers for its follow-ups (its partition still counts it)."""

    def handler_context(self, deadline: float | None, on_progress: ProgressCallback) -> JobContext:
        """Make the ``ctx`` its handler and interceptors see (kept in :attr:`ctx`);
        ``deadline``: its time limit's end (``time.monotonic``), if it has one."""
        state = self.state
        self.ctx = JobContext(
            self.job,
            topic=state.topic,
            partition=state.partition,
            offset=self.offset,
            key=self.key,
            deadline=deadline,
            on_progress=on_progress,
            job_type=self.job_type,
        )
        return self.ctx

    @property
    def at_commit_point(self) -> bool:
        """Whether this job is its partition's lowest unfinished offset. Such a job starts even
        when every slot is taken: the slots may all be held by failed jobs whose moves wait for
        the commit point to pass (a partition keeps a bounded number of moves above it, see
        :class:`.commit.moves.Mover`), and only this job can make it pass. At most one job a
        partition runs over the concurrency so."""
        return self.state.tracker.watermark == self.offset

    def __repr__(self) -> str:
        where = f"{self.state.topic}[{self.state.partition}]@{self.offset}"
        return f"<job {self.job.id} {self.job.type} at {where}>"


class IdleWaiters:
    """Coroutines waiting until no job of some partitions (or no job at all) is running.

    The job path calls :meth:`wake` when a partition's last running job finished, and only if
    :attr:`waiting` is set, so it costs nothing while nobody waits (revocation and shutdown).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, running: Callable[[], int]) -> None:
        self._loop = loop
        self._running = running
        self._waiters: list[tuple[frozenset[PartitionState], asyncio.Future[None]]] = []

    @property
    def waiting(self) -> bool:
        return bool(self._waiters)

    def idle(self, states: frozenset[PartitionState]) -> bool:
        if states:
            return all(s.in_flight == 0 for s in states)
        return self._running() == 0

    async def wait(self, states: frozenset[PartitionState], timeout: float) -> bool:
        if self.idle(states):
            return True
        future: asyncio.Future[None] = self._loop.create_future()
        self._waiters.append((states, future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return self.idle(states)
        finally:
            self._waiters = [w for w in self._waiters if w[1] is not future]
        return True

    def wake(self) -> None:
        for states, future in self._waiters:
            if not future.done() and self.idle(states):
                future.set_result(None)
