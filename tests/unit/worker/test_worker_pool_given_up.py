"""Plain-function jobs queued for a pool thread (``--threads`` below ``--concurrency``) count
as running; given up with their partition (revoked past its grace) or with the worker (stopped
after its final commit), they still started once a thread was free: beside the partition's new
owner, or after the commit that left them out. Under interceptors too, whose chain awaits the
innermost call: it started the queued job all the same, and the job then ran twice."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest

from pipeline import CallNext, JobCall, Pipeline
from pipeline.testing import InMemoryTransport

from .support import Harness


class Watches:
    """An interceptor that records what ``next`` ended with for each job (``lets``: it lets
    an exception through; else it swallows it and answers for the handler). ``cleaning``: its
    clean-up after an exception lasts past the job's time limit (called with the job's run)."""

    def __init__(self, lets: bool) -> None:
        self.lets = lets
        self.seen: dict[int, str] = {}
        self.cleaning: Callable[[Any], None] | None = None

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        i = call.kwargs["i"]
        try:
            result = await next(call)
        except BaseException as exc:
            self.seen[i] = "cancelled" if isinstance(exc, asyncio.CancelledError) else repr(exc)
            if self.cleaning is not None:
                self.cleaning(call.run)
            if self.lets:
                raise
            return "answered"
        self.seen[i] = "returned"
        return result


@pytest.mark.parametrize(
    ("given_up_by", "interceptor"),
    [
        ("revocation", None),
        ("revocation", "lets it through"),
        ("revocation", "swallows it"),  # given up all the same: no success, no commit
        ("revocation", "times out in its clean-up"),  # given up all the same: no time-out
        ("stop", None),
        ("stop", "lets it through"),  # the stop cancels every chain as it closes the pool
    ],
)
def test_a_job_waiting_for_a_pool_thread_is_not_run_once_given_up(
    given_up_by: str, interceptor: str | None
) -> None:
    started: list[int] = []
    blocking = threading.Event()
    released = threading.Event()
    watches = Watches(interceptor != "swallows it") if interceptor is not None else None

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport(), middleware=[watches] if watches else [])

        @app.job("slow", concurrency=3)
        def slow(i: int) -> None:
            started.append(i)
            if i == 0:
                blocking.set()
                released.wait(10)

        h = Harness(app, concurrency=4, threads=1, key_ordering=True)
        h.feed(*(h.message("slow", {"i": i}, key=f"k{i}".encode()) for i in range(3)))
        assert await asyncio.to_thread(blocking.wait, 10)
        processor = h.processor
        pool = processor.pool
        if watches is not None and interceptor == "times out in its clean-up":
            watches.cleaning = processor._overtime.expire  # the deadline passes meanwhile
        assert processor.in_flight == 3  # 1 and 2 wait for the one thread
        if given_up_by == "revocation":  # what Worker.revoke does once its grace is over
            h.partition.active = False
            processor.drop([h.partition])
            assert not await processor.wait_idle([h.partition], 0.05)
            h.partition.released = True
        else:  # what the stop does after its final commit
            processor.stopping = True
            processor.drop([h.partition])
            assert not await processor.wait_idle((), 0.05)
            await processor.close()
        released.set()  # job 0 returns: the thread is free for the queued ones
        if given_up_by == "revocation" or watches is None:
            assert await processor.wait_idle((), 10)  # the queued ones ended too, never run
            assert processor.in_flight == 0  # their slots are free again
            limit = processor.types.entries["slow"].limit
            assert limit is not None
            assert limit.running == 0  # and so are their type's slots
        else:
            # The stop cancelled every chain (they end with no outcome); the pool's thread
            # exits once it took the queued jobs.
            for thread in pool._threads:
                await asyncio.to_thread(thread.join, 10)
        if given_up_by == "revocation":
            await processor.close()
        # Job 0 ran: it succeeded, unless the stop cancelled its chain; the others never ran,
        # and neither failed nor succeeded (no outcome, no count).
        ran = [] if given_up_by == "stop" and watches is not None else [0]
        assert [o.offset for o in h.recorder.outcomes] == ran
        stats = h.metrics.stats["slow", "default"]
        assert (stats.succeeded, stats.failed) == (len(ran), 0)
        if given_up_by == "revocation":
            assert h.partition.commit_offset == -1  # nothing finished after the release
        if watches is not None:
            # Given up, the queued jobs' ``next`` ended as the stop's cancellation ends it.
            assert watches.seen[1] == watches.seen[2] == "cancelled"

    asyncio.run(asyncio.wait_for(main(), 30))
    assert started == [0]


def test_a_job_given_up_by_its_thread_as_its_time_limit_ends_it_ends_once() -> None:
    """The thread takes the queued job of a released partition (not run: given up) while, in
    the same turn of the loop, the job's time limit ends it: one end only, or the counts of
    running jobs drift below zero for good and the lent thread is never given back."""
    blocking, released = threading.Event(), threading.Event()

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("slow", time_limit=30)
        def slow(i: int) -> None:
            if i == 0:
                blocking.set()
                released.wait(10)

        h = Harness(app, concurrency=4, threads=1)
        processor, pool = h.processor, h.processor.pool
        done = pool._done = _Completions(2)  # before the pool's thread starts and takes it
        h.feed(*(h.message("slow", {"i": i}) for i in range(2)))
        assert await asyncio.to_thread(blocking.wait, 10)
        h.partition.active = False  # revoked, past its grace (see Worker.revoke)
        processor.drop([h.partition])
        h.partition.released = True
        # The loop stays busy while the thread ends job 0, then takes job 1 and gives it up...
        released.set()
        assert done.full.wait(10)  # on the loop's thread: the completions wait for it
        [queued] = [work for work, *_ in done if work.offset == 1]
        processor._overtime.expire(queued)  # ...and the job's timer fires in the same turn
        assert await processor.wait_idle((), 10)
        assert processor.in_flight == 0
        assert h.partition.in_flight == 0
        assert pool.overdue == 0  # the thread lent at the time limit is back
        await processor.close()

    asyncio.run(asyncio.wait_for(main(), 30))


class _Completions(deque[Any]):
    """The pool's completions, which say (``full``) once ``count`` of them are in."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.wanted = count
        self.full = threading.Event()

    def append(self, item: Any) -> None:
        super().append(item)
        if len(self) >= self.wanted:
            self.full.set()
