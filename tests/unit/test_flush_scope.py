"""What ``flush()`` waits for and raises when several threads enqueue: the jobs handed to the
producer before the call, and every failure among them that its thread was not told yet."""

from __future__ import annotations

import logging
import threading

import pytest
from confluent_kafka import KafkaError, Message

from pipeline import EnqueueError, Pipeline, Settings
from pipeline._delivery import PipelineFailure
from pipeline._failurelog import FailureLog, Taken
from pipeline.testing import InMemoryTransport

REFUSED = KafkaError.TOPIC_AUTHORIZATION_FAILED


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


def test_a_flush_waits_for_the_jobs_sent_before_it_not_for_an_empty_queue() -> None:
    """It waited until the producer held nothing at one moment, which never came while other
    threads enqueued: it raised "not acknowledged ... is it running?" after its timeout."""
    transport = _NeverEmpty()
    app = transport.app = _app(transport)
    mine = [app.enqueue("t", {"n": n}) for n in range(3)]
    app.flush(timeout=30)
    assert transport.steps == 1  # the step that acknowledged them ended the wait
    assert [job.id for job in transport.jobs("acme.jobs.default")][:3] == mine


def test_every_thread_whose_flush_covers_a_failure_hears_of_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Thread A's job is acknowledged, thread B's refused: the first flush (A's) took the
    failure, B's returned as if its job were enqueued, and nothing logged it."""
    app = _app(_RefusesBad())
    app.enqueue("t", {"x": "ok"})  # A's
    refused = app.enqueue("t", {"x": "BAD"})  # B's
    a_first, a_again = _flushes_on_a_thread(app, times=2)
    [b_first] = _flushes_on_a_thread(app)
    assert isinstance(a_first, EnqueueError)
    assert isinstance(b_first, EnqueueError)  # it returned: B believed its job enqueued
    assert a_first.job_id == b_first.job_id == refused
    assert a_again is None  # a thread is told a failure once
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._failures.tell(app.settings, now=1e9)
        app._flush_at_exit()
    assert caplog.records == []  # raised: no log line, no exit report


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


def test_failures_over_the_cap_are_let_go_and_counted_once_per_thread() -> None:
    log = FailureLog(keep=3)
    generation = log.sending(5)
    for n in range(5):
        log.answer(generation, _failure(f"job-{n}"))
    through = log.mark()
    taken = log.take(through)
    assert [f.job_id for f in taken.failures] == ["job-2", "job-3", "job-4"]
    assert taken.not_kept == 2
    assert not log.take(through)  # this thread heard of them all
    log.answer(log.sending(), _failure("job-5"))  # lets job-2 go: this thread heard of it
    assert log.take(log.mark()) == Taken([_failure("job-5")], 0)
    outcome: list[object] = []
    thread = threading.Thread(target=lambda: outcome.append(log.take(through)))
    thread.start()
    thread.join()
    [other] = outcome
    assert other == Taken([_failure(f"job-{n}") for n in (3, 4)], 3)
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
