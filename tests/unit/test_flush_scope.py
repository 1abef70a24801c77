"""What ``flush()`` waits for and raises when several threads enqueue: the jobs handed to the
producer before the call, and the failures among them that its thread sent and was not told
yet, or that no flush raised yet."""

from __future__ import annotations

import gc
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import TypeVar

import pytest
from confluent_kafka import KafkaError, Message

from pipeline import EnqueueError, KafkaUnavailableError, Pipeline, Settings
from pipeline._delivery import PipelineFailure
from pipeline._failurelog import FailureLog, Taken
from pipeline.testing import InMemoryTransport

REFUSED = KafkaError.TOPIC_AUTHORIZATION_FAILED
T = TypeVar("T")


class _RefusesBad(InMemoryTransport):
    """Kafka refuses the jobs whose payload says ``BAD`` and acknowledges the others."""

    def poll(self, timeout: float = 0) -> int:
        pending, self._pending = self._pending, []
        for sent, on_delivery in pending:
            message = Message(topic=sent.topic, value=sent.value, key=sent.key)
            if b"BAD" in sent.value:
                on_delivery(KafkaError(REFUSED, "Broker: Topic authorization failed"), message)
            else:
                self.messages.append(sent)
                on_delivery(None, message)
        return len(pending)


class _NeverEmpty(_RefusesBad):
    """Other threads keep enqueueing: each flush step acknowledges what the producer holds,
    and by its end another job is queued, so the queue is never empty."""

    def __init__(self) -> None:
        super().__init__()
        self.app: Pipeline | None = None
        self.steps = 0

    def flush(self, timeout: float) -> int:
        self.steps += 1
        self.poll()
        assert self.app is not None
        self.app.enqueue("t", {"from": "another thread"})
        return len(self._pending)


def _flushes_on_a_thread(app: Pipeline, times: int = 1) -> list[BaseException | None]:
    """Flush ``app`` ``times`` on a new thread; what each flush raised (None: it returned)."""
    outcomes: list[BaseException | None] = []

    def run() -> None:
        for _ in range(times):
            try:
                app.flush(timeout=5)
            except Exception as exc:
                outcomes.append(exc)
            else:
                outcomes.append(None)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return outcomes


def _app(transport: InMemoryTransport) -> Pipeline:
    return Pipeline(Settings(namespace="acme"), transport=transport)


class _Thread:
    """A thread that lives until :meth:`close`: :meth:`run` runs a call on it."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1)

    def run(self, call: Callable[[], T]) -> T:
        return self._pool.submit(call).result()

    def close(self) -> None:
        self._pool.shutdown()


@contextmanager
def _threads(count: int) -> Iterator[list[_Thread]]:
    """``count`` threads that live through the block."""
    threads = [_Thread() for _ in range(count)]
    try:
        yield threads
    finally:
        for thread in threads:
            thread.close()


def _flush(app: Pipeline) -> BaseException | None:
    """What ``app.flush()`` raised (None: it returned)."""
    try:
        app.flush(timeout=5)
    except Exception as exc:
        return exc
    return None


def test_a_flush_waits_for_the_jobs_sent_before_it_not_for_an_empty_queue() -> None:
    """It waited until the producer held nothing at one moment, which never came while other
    threads enqueued: it raised "not acknowledged ... is it running?" after its timeout."""
    transport = _NeverEmpty()
    app = transport.app = _app(transport)
    mine = [app.enqueue("t", {"n": n}) for n in range(3)]
    app.flush(timeout=30)
    assert transport.steps == 1  # the step that acknowledged them ended the wait
    assert [job.id for job in transport.jobs("acme.jobs.default")][:3] == mine


def test_a_thread_hears_of_its_own_jobs_failure_even_if_another_threads_flush_raised_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Thread A's job is acknowledged, thread B's refused: the first flush (A's) took the
    failure, B's returned as if its job were enqueued, and nothing logged it."""
    app = _app(_RefusesBad())
    with _threads(2) as (on_a, on_b):
        on_a.run(lambda: app.enqueue("t", {"x": "ok"}))
        refused = on_b.run(lambda: app.enqueue("t", {"x": "BAD"}))
        a_first = on_a.run(lambda: _flush(app))
        a_again = on_a.run(lambda: _flush(app))
        b_first = on_b.run(lambda: _flush(app))
        b_again = on_b.run(lambda: _flush(app))
    assert isinstance(a_first, EnqueueError)  # no call was told of it yet
    assert isinstance(b_first, EnqueueError)  # it returned: B believed its job enqueued
    assert a_first.job_id == b_first.job_id == refused
    assert a_again is None  # a thread is told a failure once
    assert b_again is None
    assert _flush(app) is None  # a third thread: A was told of it already
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._failures.tell(app.settings, now=1e9)
        app._flush_at_exit()
    assert caplog.records == []  # raised: no log line, no exit report


def test_new_threads_do_not_hear_of_a_failure_a_flush_raised_already() -> None:
    """A thread-per-request server: one lost job, raised to the thread that sent it, was raised
    again by the first flush of every new thread (an error answered to request after request,
    anyio's threads ending after 10 s idle)."""
    transport = _RefusesBad()
    app = _app(transport)
    app.enqueue("t", {"x": "BAD"})
    assert isinstance(_flush(app), EnqueueError)  # told to the thread that sent it
    outcomes: list[BaseException | None] = []

    def request(n: int) -> None:
        app.enqueue("t", {"request": n})
        outcomes.append(_flush(app))

    for n in range(20):
        thread = threading.Thread(target=request, args=(n,))
        thread.start()
        thread.join()
    assert outcomes == [None] * 20
    assert len(transport.jobs("acme.jobs.default")) == 20


def test_the_failure_of_a_thread_that_never_flushes_reaches_the_first_flush_anywhere() -> None:
    """An event loop enqueues and a worker thread flushes: the loop's lost job is raised by the
    first flush that covers it, on whichever thread, and not by the flushes of other threads
    after it."""
    app = _app(_RefusesBad())
    with _threads(3) as (on_loop, on_x, on_y):
        refused = on_loop.run(lambda: app.enqueue("t", {"x": "BAD"}))
        x_first = on_x.run(lambda: _flush(app))
        y_first = on_y.run(lambda: _flush(app))
        x_again = on_x.run(lambda: _flush(app))
    assert isinstance(x_first, EnqueueError)
    assert x_first.job_id == refused
    assert y_first is None
    assert x_again is None


def _reachable(root: object, skip: tuple[object, ...]) -> int:
    """How many objects ``root`` holds, itself and through others (not through ``skip``, nor
    classes, modules and functions, which are shared)."""
    shared = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    seen = {id(s) for s in skip}
    todo = [root]
    count = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, shared):
            continue
        seen.add(id(obj))
        count += 1
        todo.extend(gc.get_referents(obj))
    return count


def test_threads_that_flushed_and_ended_leave_nothing_behind() -> None:
    """Each failure kept the reader of every thread it was raised to: 131 MB after 2,000
    short-lived threads flushed with 1,000 failures kept."""
    transport = _RefusesBad()
    app = _app(transport)
    log = app._failures
    with _threads(1) as (on_loop,):  # its failures stay kept: it never flushes
        for n in range(5):
            on_loop.run(partial(app.enqueue, "t", {"x": "BAD", "n": n}))

    def request() -> None:
        app.enqueue("t", {"x": "ok"})
        _flush(app)

    def requests(count: int) -> int:
        for _ in range(count):
            thread = threading.Thread(target=request)
            thread.start()
            thread.join()
        gc.collect()
        return _reachable(log, skip=(transport, app))

    held = requests(10)
    assert requests(200) <= held  # nothing more for 200 more threads


def test_counting_sends_loses_none_to_other_threads() -> None:
    """Sends are counted without a lock; threads switching as often as they can lose none,
    while flushes open generations."""
    log = FailureLog()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:

        def send() -> None:
            for _ in range(20_000):
                log.sending()

        def flushes() -> None:
            while any(thread.is_alive() for thread in threads):
                log.unanswered(log.mark())

        threads = [threading.Thread(target=send) for _ in range(4)]
        marker = threading.Thread(target=flushes)
        for thread in threads:
            thread.start()
        marker.start()
        for thread in threads:
            thread.join()
        marker.join()
    finally:
        sys.setswitchinterval(switch)
    assert log.unanswered() == 80_000


def test_a_flush_does_not_raise_a_failure_of_a_job_sent_after_it_began() -> None:
    log = FailureLog()
    before = log.sending()
    through = log.mark()  # a flush begins
    after = log.sending()
    log.answer(after, PipelineFailure("later", "acme.jobs.default", REFUSED, "refused"))
    assert log.unanswered(through) == 1
    log.answer(before)
    assert log.unanswered(through) == 0
    assert not log.take(through)  # the next flush raises it
    assert log.take(log.mark()).failures[0].job_id == "later"


def _failure(job_id: str) -> PipelineFailure:
    return PipelineFailure(job_id, "acme.jobs.default", REFUSED, "Broker: refused")


def test_failures_over_the_cap_are_let_go_and_the_untold_ones_counted_once() -> None:
    """Every new thread's first flush counted every failure ever let go: past 1,000 failures,
    each one raised "over the failures kept"."""
    log = FailureLog(keep=3)
    generation = log.sending(5)
    for n in range(5):
        log.answer(generation, _failure(f"job-{n}"))
    through = log.mark()
    taken = log.take(through)
    assert [f.job_id for f in taken.failures] == ["job-2", "job-3", "job-4"]
    assert taken.not_kept == 2
    assert not log.take(through)  # this thread heard of them all
    with _threads(1) as (on_other,):
        assert on_other.run(lambda: log.take(through)) == Taken([], 0)
        for n in range(5, 9):  # no thread's: job-5 is let go before any flush raised it
            log.add(_failure(f"job-{n}"))
        other = on_other.run(lambda: log.take(log.mark()))
    assert other == Taken([_failure(f"job-{n}") for n in (6, 7, 8)], 1)
    assert not log.take(log.mark())  # counted once, anywhere
    assert not log.unreported()  # told: nothing for the exit report


def test_the_error_carries_every_failed_job_and_the_with_block_logs_them_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only the first failed job was named; the others' ids were in no message nor attribute."""
    app = _app(_RefusesBad())
    refused = [app.enqueue("t", {"x": "BAD", "n": n}) for n in range(3)]
    with pytest.raises(EnqueueError) as caught:
        app.flush()
    error = caught.value
    assert error.failed_ids == refused
    assert [f.reason for f in error.failures] == ["Broker: Topic authorization failed"] * 3
    assert str(error).startswith(f"job {refused[0]} was not enqueued: not authorized")
    assert "(and 2 more job(s): its failed_ids names them all)" in str(error)

    def body() -> None:
        with _app(_RefusesBad()) as app:
            lost.extend(app.enqueue("t", {"x": "BAD", "n": n}) for n in range(3))
            raise ValueError("body")

    lost: list[str] = []
    with (
        caplog.at_level(logging.ERROR, logger="pipeline.producer"),
        pytest.raises(ValueError, match="body"),
    ):
        body()
    [record] = caplog.records
    assert all(job_id in record.getMessage() for job_id in lost)
    assert record.job_ids == lost  # type: ignore[attr-defined]


def test_a_failure_raised_to_the_call_that_waited_for_its_job_is_not_raised_again() -> None:
    """`enqueue(..., wait=True)` told its caller, who knows which job it is; a flush on another
    thread then raised it again (a web request answered 503, then the app's close at exit)."""
    app = _app(_RefusesBad())
    outcome: list[BaseException] = []

    def request() -> None:
        try:
            app.enqueue("t", {"n": "BAD"}, wait=True)
        except EnqueueError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    thread.join()
    assert len(outcome) == 1, "the waiting caller hears of it"
    assert _flushes_on_a_thread(app) == [None]
    app.close(5)  # and nothing is left to report here either


class _Late(_RefusesBad):
    """Kafka answers only once told to (:attr:`answers`), long after a caller stopped waiting."""

    answers = False

    def poll(self, timeout: float = 0) -> int:
        return super().poll() if self.answers else 0


def test_a_failure_that_comes_after_its_wait_timed_out_is_still_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The wait raised a timeout, never the failure: the caller does not know the job failed,
    so the failure is logged and reported at exit like any other nobody raised."""
    transport = _Late()
    app = _app(transport)
    handle = app.submit("t", {"n": "BAD"})
    with pytest.raises(KafkaUnavailableError, match="not acknowledged within"):
        handle.wait(timeout=0.05)
    transport.answers = True
    transport.poll()  # refused, once the caller had given up on it
    unreported = app._failures.unreported()  # what the exit report would log
    assert [f.job_id for f in unreported.failures] == [handle.job_id]
    # A failure that comes while its caller waits is raised to it, and reported nowhere else.
    waited = app.submit("t", {"n": "BAD"})
    with pytest.raises(EnqueueError, match="not authorized"):
        waited.wait(timeout=5)
    assert not app._failures.unreported()
