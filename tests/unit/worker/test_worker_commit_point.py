"""The job at a partition's commit point always gets to run: failed jobs whose moves wait for
room above the commit point hold every slot, and only that job can make room."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from confluent_kafka import Message

from pipeline import Job, Pipeline, Priority, Settings
from pipeline._job import now_ms
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._work import PartitionState
from pipeline_worker.commit.moves import Mover
from pipeline_worker.commit.offsets import OffsetTracker
from pipeline_worker.execute.processor import Processor
from pipeline_worker.intake.consumer import _commit_point
from pipeline_worker.route.policy import FailurePolicy
from pipeline_worker.route.router import FailureRouter

from ..test_transactions import FakeProducer

PRIORITIES = list(Priority)


class SignallingTracker(OffsetTracker):
    """An offset tracker that sets ``changed`` whenever an offset finishes."""

    __slots__ = ("changed",)

    def __init__(self, changed: asyncio.Event) -> None:
        super().__init__()
        self.changed = changed

    def finish(self, offset: int) -> int | None:
        watermark = super().finish(offset)
        self.changed.set()
        return watermark


def test_a_held_job_at_the_commit_point_runs_while_moves_above_it_hold_every_slot() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        settings = Settings(
            namespace="acme", worker={"concurrency": 2, "offset_metadata_max_bytes": 1024}
        )
        app = Pipeline(settings)
        ran = asyncio.Event()

        @app.job("held")
        def held() -> None:
            loop.call_soon_threadsafe(ran.set)

        @app.job("fails")
        def fails() -> None:
            raise RuntimeError("downstream down")

        metrics = WorkerMetrics()
        mover = Mover(settings, loop, producer_factory=lambda conf: FakeProducer())  # type: ignore[arg-type,return-value]
        policy = FailurePolicy("acme", [5.0], codec=app.codec, worker="w", events=False)
        processor = Processor(
            app=app,
            worker=settings.worker,
            priorities=PRIORITIES,
            topics={p: app.topics.jobs(p) for p in PRIORITIES},
            loop=loop,
            metrics=metrics,
            middleware=[],
            context=contextvars.copy_context(),
            router=FailureRouter(policy, mover, metrics),
        )
        topic = app.topics.jobs("default")
        state = PartitionState(topic, 0, Priority.DEFAULT, PRIORITIES.index(Priority.DEFAULT))
        # Offset 0 comes a little early (as the scheduler releases jobs): held, without a slot.
        # The 99 behind it fail at once, more than the moves a partition keeps above its commit
        # point: the last ones wait for room, each holding its slot.
        jobs = [Job(id="held", type="held", payload=b"{}", not_before=now_ms() + 1000)]
        jobs += [Job(id=f"fails-{n}", type="fails", payload=b"{}") for n in range(1, 100)]
        messages = [
            Message(topic=topic, partition=0, offset=n, value=app.codec.encode(job))
            for n, job in enumerate(jobs)
        ]
        # The consumer thread's part: write the moves that have room and commit, each time a
        # move is submitted or an offset finishes (which may move the commit point).
        changed = asyncio.Event()
        state.tracker = SignallingTracker(changed)
        submit = mover.submit

        def submitting(*args: Any, **kwargs: Any) -> None:
            submit(*args, **kwargs)
            changed.set()

        mover.submit = submitting  # type: ignore[method-assign]
        state.handed += len(messages)
        processor.on_batch([(state, messages)])
        deadline = loop.time() + 10
        while not (ran.is_set() and state.commit_offset == len(messages)):
            changed.clear()
            mover.drain(lambda where: True, lambda where: state.commit_offset)
            if mover.open:
                mover.commit([], None, lambda where: True)
            try:
                await asyncio.wait_for(changed.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                break  # nothing moves any more
        assert ran.is_set(), "the held job at the commit point never got a slot"
        assert state.commit_offset == len(messages)
        assert processor.in_flight == 0
        await processor.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_until_a_job_of_the_assignment_finished_the_commit_point_is_the_committed_offset() -> None:
    # The moves a previous owner made above it are restored as this partition's: with a full
    # list, a commit point of -1 would leave no room even for the job at the real one.
    state = PartitionState("acme.jobs.default", 0, Priority.DEFAULT, 0)
    states = {("acme.jobs.default", 0): state}
    state.committed = 10
    assert _commit_point(states, ("acme.jobs.default", 0)) == 10
    state.commit_offset = 12
    assert _commit_point(states, ("acme.jobs.default", 0)) == 12
    assert _commit_point(states, ("acme.jobs.default", 1)) == -1
