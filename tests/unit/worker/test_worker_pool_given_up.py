"""Plain-function jobs queued for a pool thread (``--threads`` below ``--concurrency``) count
as running; given up with their partition (revoked past its grace) or with the worker (stopped
after its final commit), they still started once a thread was free: beside the partition's new
owner, or after the commit that left them out."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pipeline import Pipeline
from pipeline.testing import InMemoryTransport

from .support import Harness


@pytest.mark.parametrize("given_up_by", ["revocation", "stop"])
def test_a_job_waiting_for_a_pool_thread_is_not_run_once_given_up(given_up_by: str) -> None:
    started: list[int] = []
    blocking = threading.Event()
    released = threading.Event()

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("slow")
        def slow(i: int) -> None:
            started.append(i)
            if i == 0:
                blocking.set()
                released.wait(10)

        h = Harness(app, concurrency=4, threads=1)
        h.feed(*(h.message("slow", {"i": i}) for i in range(3)))
        assert await asyncio.to_thread(blocking.wait, 10)
        processor = h.processor
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
        assert await processor.wait_idle((), 10)  # the queued ones ended too, never run
        assert processor.in_flight == 0  # their slots are free again
        if given_up_by == "revocation":
            await processor.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert started == [0]
