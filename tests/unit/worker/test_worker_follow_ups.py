"""A job whose handler enqueued jobs ends once Kafka answered for them (its follow-ups)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

import pipeline._followups
from pipeline import CallNext, EnqueueError, JobCall, KafkaUnavailableError, Pipeline, Settings
from pipeline._followups import FollowUps, follow_ups
from pipeline.testing import InMemoryTransport
from pipeline_worker import Middleware, Outcome, OutcomeKind
from pipeline_worker.route.followups import FollowUpWatch
from tests.waiting import until

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


class OneAtATime(HeldTransport):
    """Holds one job at a time (a full local queue refuses the next), and answers one job a
    poll once :meth:`answer` was called."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    def produce_many(self, topic: str, values: list[bytes], key: Any, on_delivery: Any) -> None:
        for value in values:
            if self._pending:
                self.refused += 1
                raise KafkaUnavailableError("the local queue is full")
            self.produce(topic, value, key, on_delivery)

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            self.polls += 1
            if self.held or not self._pending:
                return 0
            first, rest = self._pending[:1], self._pending[1:]
            self._pending = first
            served = InMemoryTransport.poll(self, timeout)
            self._pending = rest
            return served


def test_a_batch_the_producer_took_part_of_counts_the_jobs_it_took() -> None:
    transport = OneAtATime()
    sender = Pipeline(transport=transport)
    app = Pipeline(transport=InMemoryTransport())
    sent: list[list[str]] = []

    @app.job("parent")
    def parent() -> None:
        try:
            sender.enqueue_many("child", [{"n": 1}, {"n": 2}])
        except KafkaUnavailableError as exc:
            sent.append(exc.enqueued_ids)  # type: ignore[attr-defined]

    async def main() -> None:
        h = Harness(app)
        h.feed(h.message("parent"))
        await until(lambda: bool(sent))
        assert len(sent[0]) == 1  # the first job was taken, the second refused
        polls = transport.polls
        await until(lambda: transport.polls >= polls + 3)
        assert h.recorder.outcomes == []  # it waits for the job the producer took
        transport.answer()
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.SUCCEEDED
        assert len(transport.messages) == 1

    run(main)
    assert transport.refused == 1


def test_a_job_whose_follow_ups_kafka_never_answers_fails_after_the_delivery_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pipeline._followups, "ANSWER_MARGIN_S", 0.1)
    transport = HeldTransport()  # never answers: a producer closed before it told their fate
    # The delivery timeout of the application that enqueued the follow-up counts, not the
    # worker's (which would wait five minutes here).
    sender = Pipeline(transport=transport, producer={"delivery_timeout_s": 0.2})
    app = Pipeline(transport=InMemoryTransport(), producer={"delivery_timeout_s": 300})

    @app.job("parent")
    def parent() -> None:
        sender.enqueue("child")

    async def main() -> None:
        h = Harness(app)
        h.feed(h.message("parent"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.FAILED
        assert isinstance(outcome.error, KafkaUnavailableError)
        assert "did not answer for the jobs job job-0 enqueued within 0.3s" in str(outcome.error)
        assert h.processor.in_progress == 0

    run(main)


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_the_follow_ups_of_a_job_past_its_time_limit_are_reported_as_any_enqueue(
    kind: str,
) -> None:
    transport = InMemoryTransport(fail_with=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    app = Pipeline(transport=transport)
    back = threading.Event()

    if kind == "plain":

        @app.job("parent", time_limit=0.05, max_attempts=1)
        def parent() -> None:
            app.enqueue("child")
            back.wait(5)  # past its time limit

    else:

        @app.job("parent", time_limit=0.05, max_attempts=1)
        async def parent() -> None:
            app.enqueue("child")
            await asyncio.to_thread(back.wait, 5)

    async def main() -> None:
        h = Harness(app)
        h.feed(h.message("parent"))
        [outcome] = await h.recorder.wait_for(1)
        assert outcome.kind is OutcomeKind.TIMED_OUT
        app.poll()  # Kafka refuses the follow-up after the job ended
        back.set()
        await until(lambda: h.processor.pool.overdue == 0)

    run(main)
    with pytest.raises(EnqueueError, match="not authorized"):
        app.flush(1)


class GivesUp:
    """Gives up on job 0's run once it started (its thread runs on); runs the others."""

    def __init__(self, started: asyncio.Event) -> None:
        self.started = started

    async def intercept(self, call: JobCall, next: CallNext) -> Any:
        if call.kwargs["i"] != 0:
            return await next(call)
        run = asyncio.ensure_future(next(call))
        await self.started.wait()
        run.cancel()
        return None


def test_a_thread_still_running_a_waiting_jobs_handler_keeps_its_key() -> None:
    transport = HeldTransport()
    release = threading.Event()
    started: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        first_started = asyncio.Event()
        app = Pipeline(transport=transport, middleware=[GivesUp(first_started)])

        @app.job("slow")
        def slow(i: int) -> None:
            started.append(i)
            if i == 0:
                app.enqueue("child")  # a follow-up Kafka has not answered for
                loop.call_soon_threadsafe(first_started.set)
                release.wait(5)

        h = Harness(app, concurrency=4, threads=2, key_ordering=True)
        h.feed(*(h.message("slow", {"i": i}, key=b"k") for i in range(2)))
        await first_started.wait()
        polls = transport.polls
        # Job 0's chain ended meanwhile, and the pool had the time to grow (GROW_AFTER_S).
        await until(lambda: transport.polls >= polls + 20)
        assert started == [0]  # its thread still runs: job 1, of the same key, waits
        release.set()
        transport.answer()
        await h.recorder.wait_for(2)
        assert h.partition.commit_offset == 2

    run(main)
    assert started == [0, 1]


def test_a_job_whose_answer_another_handler_served_ends_outside_that_handler_s_context() -> None:
    transport = HeldTransport()
    app = Pipeline(transport=transport)
    ended_in: list[object] = []
    served = threading.Event()

    class SeesTheContext(Middleware):
        def on_outcome(self, outcome: Outcome) -> None:
            if outcome.job is not None and outcome.job.type == "parent":
                ended_in.append(pipeline._followups.RUNNING.get())

    @app.job("parent")
    def parent() -> None:
        app.enqueue("child")

    @app.job("server")
    def server() -> None:
        transport.answer()  # Kafka answers; this handler serves the parent's answer
        app.poll(0)
        served.set()

    async def main() -> None:
        h = Harness(app, middleware=[SeesTheContext()], concurrency=4, threads=1)
        h.feed(h.message("parent"))
        await until(lambda: h.processor.in_progress == 1 and h.processor.in_flight == 0)
        h.feed(h.message("server"))
        outcomes = await h.recorder.wait_for(2)
        assert sorted(o.job.type for o in outcomes if o.job is not None) == ["parent", "server"]
        assert served.is_set()

    run(main)
    assert ended_in == [None]


def test_what_a_thread_outliving_its_job_enqueued_is_reported_once_it_is_back() -> None:
    transport = InMemoryTransport(fail_with=KafkaError.TOPIC_AUTHORIZATION_FAILED)
    release = threading.Event()

    class GivesUpAtOnce:
        async def intercept(self, call: JobCall, next: CallNext) -> Any:
            run = asyncio.ensure_future(next(call))
            await until(started.is_set)
            run.cancel()  # the chain ends; the plain function's thread runs on
            return None

    started = threading.Event()
    app = Pipeline(transport=transport, middleware=[GivesUpAtOnce()])

    @app.job("slow")
    def slow() -> None:
        started.set()
        release.wait(5)

    async def main() -> None:
        h = Harness(app, concurrency=2, threads=2)
        overtime = h.processor._overtime
        ended = overtime.ended

        def enqueue_as_the_job_ends(work: Any) -> bool:
            # The thread, still running, enqueues in the instant the job ends (its context is
            # the job's): no end of the job sees this follow-up.
            if work.follow_ups is None and work.context is not None:
                work.context.copy().run(app.enqueue, "child")
            return ended(work)

        overtime.ended = enqueue_as_the_job_ends  # type: ignore[method-assign]
        h.feed(h.message("slow"))
        await h.recorder.wait_for(1)
        release.set()
        await until(lambda: h.processor.pool.overdue == 0)  # the thread is back

    run(main)
    app.poll(0)  # Kafka refuses the child
    with pytest.raises(EnqueueError, match="not authorized"):
        app.flush(1)


class _Clock:
    """An event loop's timers on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Any] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Any, *args: Any) -> Any:
        timer = SimpleNamespace(cancel=lambda: None, when=self.now + delay, callback=callback)
        self.timers.append(timer)
        return timer

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> None:
        callback()

    def run_due(self) -> None:
        due = [t for t in self.timers if t.when <= self.now]
        self.timers = [t for t in self.timers if t.when > self.now]
        for timer in due:
            timer.callback()


def test_a_job_held_again_is_given_up_at_its_new_deadline_not_its_first() -> None:
    """Kafka answered a waiting job's follow-up as a thread its handler started enqueued one
    more: the job is held again, with a new deadline, and its first one does not end it."""
    clock = _Clock()
    ends: list[tuple[float, str | None]] = []

    def complete(work: Any, error: BaseException | None, ended: float) -> None:
        ends.append((clock.now, type(error).__name__ if error else None))
        if error is None and watch.hold(work, ended):
            return
        watch.release(work, error)
        work.finished = True

    watch = FollowUpWatch(clock, Settings(), complete, lambda: None, free=lambda work: None)  # type: ignore[arg-type]
    follow = FollowUps()

    class Held(SimpleNamespace):
        __hash__ = object.__hash__  # type: ignore[assignment]

    work = Held(follow_ups=follow, finished=False, timer=None, job=SimpleNamespace(id="j"))
    follow.sending(1, lambda timeout: 0, 100.0)
    assert watch.hold(work, 0.0)  # type: ignore[arg-type]  # its deadline: 100
    clock.now = 50.0
    follow.answered(None, None)
    follow.sending(1, lambda timeout: 0, 100.0)  # the late one: held again, until 150
    clock.run_due()
    clock.now = 120.0
    watch._poll()
    assert ends == [(50.0, None)]  # held again at 50, and still waiting at 120
    clock.now = 151.0
    watch._poll()
    assert ends == [(50.0, None), (151.0, "KafkaUnavailableError")]
