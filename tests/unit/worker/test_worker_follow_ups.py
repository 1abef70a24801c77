"""A job whose handler enqueued jobs ends once Kafka answered for them (its follow-ups)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline import EnqueueError, Pipeline
from pipeline._followups import follow_ups
from pipeline.testing import InMemoryTransport
from pipeline_worker import OutcomeKind

from .support import Harness


class HeldTransport(InMemoryTransport):
    """Answers for nothing until :meth:`answer` (then as the in-memory transport does)."""

    def __init__(self, fail_with: int | None = None) -> None:
        super().__init__(fail_with=fail_with)
        self._lock = threading.Lock()
        self.held = True
        self.polls = 0
        self.produced = threading.Event()

    def produce(self, *args: Any) -> None:
        with self._lock:
            super().produce(*args)
        self.produced.set()

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            self.polls += 1
            return 0 if self.held else super().poll(timeout)

    def answer(self) -> None:
        with self._lock:
            self.held = False


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


async def until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_the_offset_waits_until_kafka_acknowledged_what_the_handler_enqueued(kind: str) -> None:
    transport = HeldTransport()
    app = Pipeline(transport=transport)

    if kind == "plain":

        @app.job("parent")
        def parent(n: int) -> None:
            app.enqueue("child", {"n": n})

    else:

        @app.job("parent")
        async def parent(n: int) -> None:
            app.enqueue("child", {"n": n})

    async def main() -> None:
        h = Harness(app)
        h.feed(h.message("parent", {"n": 1}))
        await asyncio.to_thread(transport.produced.wait, 5)
        # The handler returned; Kafka has not answered for its follow-up, polled again and again.
        polls = transport.polls
        await until(lambda: transport.polls >= polls + 3)
        assert h.recorder.outcomes == []
        assert h.partition.commit_offset == -1
        assert (h.processor.in_flight, h.processor.in_progress, h.partition.in_flight) == (0, 1, 1)
        transport.answer()
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.SUCCEEDED
        assert h.partition.commit_offset == 1
        assert (h.processor.in_flight, h.processor.in_progress, h.partition.in_flight) == (0, 0, 0)

    run(main)
    [child] = transport.jobs(app.topics.jobs("default"))
    assert child.type == "child"


def test_a_job_waiting_for_kafka_gives_its_slot_and_key_to_the_next_job() -> None:
    transport = HeldTransport()
    sender = Pipeline(transport=transport)
    app = Pipeline(transport=InMemoryTransport())
    ran: list[int] = []

    @app.job("parent")
    def parent(n: int) -> None:
        ran.append(n)
        sender.enqueue("child", {"n": n})

    async def main() -> None:
        h = Harness(app, concurrency=1, key_ordering=True)
        h.feed(*(h.message("parent", {"n": n}, key=b"k") for n in range(3)))
        # One slot, one key: each job starts once the one before returned, whose offset waits.
        await until(lambda: len(ran) == 3 and h.processor.in_progress == 3)
        assert h.recorder.outcomes == []
        assert h.partition.commit_offset == -1
        transport.answer()
        outcomes = await h.recorder.wait_for(3)
        assert [o.kind for o in outcomes] == [OutcomeKind.SUCCEEDED] * 3
        assert h.partition.commit_offset == 3
        assert (h.processor.in_flight, h.processor.in_progress) == (0, 0)

    run(main)
    assert ran == [0, 1, 2]
    assert [job.payload for job in transport.jobs(app.topics.jobs("default"))] == [
        b'{"n":0}',
        b'{"n":1}',
        b'{"n":2}',
    ]


@pytest.mark.parametrize("many", [False, True])
def test_a_follow_up_kafka_refused_fails_the_job_and_is_not_reported_twice(many: bool) -> None:
    transport = HeldTransport(fail_with=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    sender = Pipeline(transport=transport)  # a handler may enqueue with any application
    app = Pipeline(transport=InMemoryTransport())

    @app.job("parent")
    def parent() -> None:
        if many:
            sender.enqueue_many("child", [{"n": 1}, {"n": 2}])
        else:
            sender.enqueue("child", {"n": 1})

    async def main() -> None:
        h = Harness(app)
        h.feed(h.message("parent"))
        await asyncio.to_thread(transport.produced.wait, 5)
        transport.answer()
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.FAILED
        assert isinstance(outcome.error, EnqueueError)
        assert "lacks WRITE on TOPIC" in str(outcome.error), outcome.error

    run(main)
    sender.flush(1)  # the refusal was the job's: the application's log does not raise it again


def test_a_refusal_the_handler_waited_for_and_handled_is_not_the_jobs() -> None:
    transport = InMemoryTransport(fail_with=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    app = Pipeline(transport=transport)
    caught: list[BaseException] = []

    @app.job("parent")
    def parent() -> None:
        try:
            app.enqueue("child", wait=True)
        except EnqueueError as exc:
            caught.append(exc)

    async def main() -> None:
        h = Harness(app)
        h.feed(h.message("parent"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.SUCCEEDED

    run(main)
    assert len(caught) == 1


def test_the_follow_ups_of_a_failed_job_are_reported_as_any_enqueue() -> None:
    transport = HeldTransport(fail_with=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    app = Pipeline(transport=transport)

    @app.job("parent", max_attempts=1)
    def parent() -> None:
        app.enqueue("child")
        raise ValueError("the handler's own failure")

    async def main() -> None:
        h = Harness(app)
        h.feed(h.message("parent"))
        [outcome] = await h.recorder.wait_for(1)  # ended without waiting for the follow-up
        assert outcome.kind is OutcomeKind.FAILED
        assert isinstance(outcome.error, ValueError)
        transport.answer()

    run(main)
    with pytest.raises(EnqueueError, match="not authorized"):
        app.flush(1)


def test_an_enqueue_outside_a_job_or_after_it_ended_is_no_follow_up() -> None:
    app = Pipeline(transport=InMemoryTransport())
    leftovers: list[object] = []
    after = threading.Event()

    @app.job("parent")
    async def parent() -> None:
        def later() -> None:
            leftovers.append(follow_ups())
            after.set()

        # A callback that outlives its job runs in a copy of the job's context.
        asyncio.get_running_loop().call_later(0.05, later)

    async def main() -> None:
        assert follow_ups() is None
        h = Harness(app)
        h.feed(h.message("parent"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.SUCCEEDED
        await until(after.is_set)

    run(main)
    assert leftovers == [None]
