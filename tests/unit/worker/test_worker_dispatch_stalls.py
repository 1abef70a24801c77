"""Jobs that could start but were left waiting: nothing came along to start them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from confluent_kafka import Message

from pipeline import Pipeline
from pipeline._job import now_ms
from pipeline._tenantsettings import TenantSettings
from pipeline.testing import InMemoryTransport
from pipeline_worker import OutcomeKind
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._work import Work
from pipeline_worker.dispatch.fair import FairQueue
from pipeline_worker.dispatch.limits import TypeLimit
from pipeline_worker.dispatch.tenants import TenantTable

from .support import FakeTimers, Harness, Jobs, state
from .test_worker_dispatch import dispatcher, enqueue
from .test_worker_executor import until


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


def test_a_held_job_given_up_at_revocation_starts_the_job_waiting_for_its_type() -> None:
    """The held job kept its type's one slot; given up when its timer fired, it gave the slot
    to the other partition's job, which nothing then started: its partition stood still."""

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())
        ran: list[int] = []

        @app.job("capped", concurrency=1)
        async def capped(i: int) -> None:
            ran.append(i)

        h = Harness(app, concurrency=4)
        gone = h.partition
        kept = state(2, partition=1, topic=gone.topic)
        # Released a little early by the scheduler: held, with the type's slot.
        h.feed(h.message("capped", {"i": 0}, not_before=now_ms() + 100))
        job = h.message("capped", {"i": 1}, offset=0)
        kept.handed += 1
        other = Message(topic=kept.topic, partition=1, offset=0, value=job.value())
        h.processor.on_batch([(kept, [other])])
        limit = h.processor.types.entries["capped"].limit
        assert limit is not None
        assert len(limit.waiting) == 1  # the other partition's job waits for the slot
        gone.active = False  # the revocation, as the worker's revoke() does it
        h.processor.drop([gone])
        [outcome] = await h.recorder.wait_for(1, timeout=5.0)
        assert outcome.kind is OutcomeKind.SUCCEEDED
        assert ran == [1]
        assert kept.commit_offset == 1

    run(main)


def test_a_drop_that_admits_jobs_of_other_partitions_says_they_are_ready() -> None:
    """A job waiting for a type's rate held its tenant's slot; dropped, the slot went to
    another partition's job, admitted and never started (the type's timer found nobody
    waiting any more, so it did not wake the worker either)."""
    timers = FakeTimers()
    ready: list[int] = []
    d = dispatcher(timers=timers, ready=ready)
    jobs = Jobs()
    tenant = TypeLimit[Work]("tenant acme", cap=1, rate_limit=None, now=0.0)
    rated = TypeLimit[Work]("rated", cap=None, rate_limit=1.0, now=0.0)
    rated.set_share(1, 1, 0.0)
    gone, kept = state(0, partition=0), state(0, partition=1)
    first = jobs.work(gone, "rated", limit=rated)
    waits_for_rate = jobs.work(gone, "rated", limit=rated)
    waits_for_tenant = jobs.work(kept, "plain")
    for work in (waits_for_rate, waits_for_tenant):
        work.tenant_limit = tenant
    for work in (first, waits_for_rate, waits_for_tenant):
        enqueue(d, work)
    assert d.pop() is first  # the bucket's one token
    assert d.pop() is None  # the next waits for a token holding acme's slot; the last for acme
    assert d.drop([gone]) == [waits_for_rate]
    assert ready == [1]
    assert d.pop() is waits_for_tenant


def test_a_rate_that_grows_at_a_rebalance_admits_at_the_new_rate_at_once() -> None:
    """The timer armed at the old, small share was kept: the jobs waiting for the rate waited
    for it (here 100 s) instead of the new share's next token (1 s)."""
    timers = FakeTimers()
    ready: list[int] = []
    d = dispatcher(timers=timers, ready=ready)
    jobs = Jobs()
    limit = TypeLimit[Work]("rated", cap=None, rate_limit=1.0, now=0.0)
    limit.set_share(1, 100, 0.0)  # one partition of 100: 0.01 jobs/s
    partition = state(0)
    for _ in range(3):
        enqueue(d, jobs.work(partition, "rated", limit=limit))
    assert d.pop() is not None  # the bucket's one token
    assert d.pop() is None
    limit.set_share(100, 100, timers.now)  # every partition now: 1 job/s
    d.refresh_limits([limit])
    timers.advance(1.01)
    assert d.pop() is not None, "still waiting for the old share's timer"
    timers.advance(1.01)
    assert d.pop() is not None


def test_tenant_weights_below_one_never_spin_the_dispatcher() -> None:
    """Each turn of a lane added its weight to its credit and served nothing below 1: with
    every tenant's weight tiny the queue went round its lanes for ever, on the event loop."""
    settings = TenantSettings.model_validate(
        {"default_weight": 1e-300, "named": {"acme": {"weight": 3e-300}}}
    )
    table = TenantTable(settings, WorkerMetrics())
    queue = FairQueue(table.weight, key_ordering=False)
    jobs = Jobs()
    partition = state(0)
    for tenant in ("acme", "zed", "acme", "zed", "acme", "acme"):
        work = jobs.work(partition)
        work.job.tenant = tenant
        queue.append(work)
    taken: list[list[Work]] = []
    thread = threading.Thread(target=lambda: taken.append(queue.take(4)), daemon=True)
    thread.start()
    thread.join(5.0)
    assert taken, "the queue spun without serving a job"
    tenants = [w.job.tenant for w in taken[0]]
    assert tenants.count("acme") == 3  # the weights' ratio holds: 3 to 1
    assert tenants.count("zed") == 1


def test_a_thread_kept_past_its_job_time_limit_is_replaced() -> None:
    """A thread cannot be killed: with every pool thread stuck in a job past its deadline, the
    jobs handed to the pool waited for a thread that never came (failed at their own limit
    without running, or holding their slot for good), and the worker ran nothing more."""

    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())
        release = threading.Event()
        ran: list[str] = []

        @app.job("hangs", time_limit=0.05)
        def hangs() -> None:
            release.wait(10)  # a socket without a timeout

        @app.job("quick", time_limit=2.0)
        def quick() -> None:
            ran.append("quick")

        h = Harness(app, concurrency=2, threads=1)
        pool = h.processor.pool
        back = asyncio.Event()
        give_back = pool.give_back

        def given_back() -> None:
            give_back()
            back.set()

        pool.give_back = given_back  # type: ignore[method-assign]
        h.feed(h.message("hangs"), h.message("quick"))
        try:
            outcomes = await h.recorder.wait_for(2)
            assert [o.kind for o in outcomes] == [OutcomeKind.TIMED_OUT, OutcomeKind.SUCCEEDED]
            assert ran == ["quick"]
            assert h.processor.pool.threads == 2
            assert h.processor.pool.overdue == 1  # pipeline_worker_threads_overdue
        finally:
            release.set()
        await until(lambda: pool.overdue == 0, back)  # the hung thread came back

    run(main)
