"""A producer's callbacks are served by a thread of its own: a process that enqueues now and then
and never calls ``flush()`` (a web service) hears of a job Kafka failed, and of an outage, while
it runs, not at its exit (which a SIGKILL or an unhandled SIGTERM never reaches).

Against librdkafka with an unreachable bootstrap (127.0.0.1:1: refused at once), and against a
stand-in producer where the thread's hand-over with ``close()`` is observed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

import pipeline._producer as producer_module
import pipeline._transport as transport_module
from pipeline import EnqueueError, KafkaUnavailableError, Pipeline, PipelineError, Settings
from pipeline._brokerhealth import BrokerHealth
from pipeline._delivery import JobHandle, PipelineFailure
from pipeline._failurelog import FailureLog
from pipeline._producer import KafkaTransport
from pipeline.testing import InMemoryTransport
from tests.waiting import wait_for

UNREACHABLE = "127.0.0.1:1"
THREAD = "pipeline-producer-poll"


@pytest.fixture(autouse=True)
def _fast_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "POLL_EVERY_S", 0.1, raising=False)


def _app(servers: str = UNREACHABLE) -> Pipeline:
    BrokerHealth._trackers.pop(servers, None)  # a tracker that saw no outage yet
    settings = Settings(
        namespace="acme",
        bootstrap_servers=servers,
        producer={"delivery_timeout_s": 1.0, "exit_flush_timeout_s": 0},
    )
    return Pipeline(settings)


def _discard(app: Pipeline) -> None:
    """Close ``app``, whose jobs failed or are dropped now."""
    app._transport.purge()  # type: ignore[attr-defined]
    with contextlib.suppress(PipelineError):
        app.close(timeout=1)


def _poll_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == THREAD}


def _told(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "enqueued job(s) never reached Kafka" in r.getMessage()]


def test_a_job_that_fails_unflushed_is_logged_at_error_while_the_process_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app()
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        job_id = app.enqueue("email.send", {"to": "a@b.c"})
        assert wait_for(lambda: bool(_told(caplog)), timeout=15)  # no flush(), no exit
    [line] = _told(caplog)
    assert line.levelno == logging.ERROR
    message = line.getMessage()
    assert message.startswith(f"1 enqueued job(s) never reached Kafka at {UNREACHABLE}")
    assert "not acknowledged within the delivery timeout of 1s" in message
    assert job_id in message
    # Logged, and still raised by the next flush, as before.
    with pytest.raises(KafkaUnavailableError, match=job_id):
        app.flush(timeout=1)
    app.close(timeout=1)


def test_an_outage_is_logged_without_a_flush(caplog: pytest.LogCaptureFixture) -> None:
    app = _app()
    with caplog.at_level(logging.WARNING, logger="pipeline.kafka"):
        app.enqueue("email.send", {"to": "a@b.c"})
        assert wait_for(
            lambda: any("unreachable since" in r.getMessage() for r in caplog.records), 15
        )
    _discard(app)


def test_the_thread_ends_when_the_application_is_closed_or_flushed_at_exit() -> None:
    before = _poll_threads()
    app = _app()
    app.enqueue("email.send", {"to": "a@b.c"})
    [thread] = _poll_threads() - before  # one, from the first producer on
    assert thread.daemon
    assert thread.is_alive()
    with pytest.raises(KafkaUnavailableError):
        app.close(timeout=0.1)
    assert not thread.is_alive()

    app = _app()
    app.enqueue("email.send", {"to": "a@b.c"})
    [thread] = _poll_threads() - before
    app._flush_at_exit()  # stops the thread before its flush
    assert not thread.is_alive()


def test_a_forked_child_serves_its_own_producer_with_a_thread_of_its_own() -> None:
    before = _poll_threads()
    app = _app()
    app.enqueue("email.send", {"to": "parent@b.c"})
    [parent_thread] = _poll_threads() - before
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            assert not _poll_threads()  # the parent's threads are not the child's
            job_id = app.enqueue("email.send", {"to": "child@b.c"})
            # Its own job only (the parent's is the parent's), failed with nobody flushing.
            failed = wait_for(lambda: bool(app._failures._kept), timeout=10)
            [thread] = _poll_threads()
            mine = [k.failure.job_id for k in app._failures._kept] == [job_id]
            code = 0 if failed and mine and thread.is_alive() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_thread.is_alive()  # the parent's is untouched
    _discard(app)


made: list[_StandIn] = []


class _StandIn:
    """librdkafka's Producer as KafkaTransport uses it; records which threads poll it, and
    holds a poll of the background thread until ``release`` while ``hold`` is set."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.pollers: list[threading.Thread] = []
        self.hold = False
        self.in_poll = threading.Event()
        self.release = threading.Event()
        made.append(self)

    def __len__(self) -> int:
        return 0

    def produce(self, topic: str, value: bytes, key: bytes | None, *, on_delivery: Any) -> None:
        return None

    def poll(self, timeout: float = 0) -> int:
        self.pollers.append(threading.current_thread())
        if self.hold and threading.current_thread().name == THREAD:
            self.in_poll.set()
            self.release.wait(5)
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def background_polls(self) -> int:
        return sum(t.name == THREAD for t in self.pollers)


@pytest.fixture
def transport(monkeypatch: pytest.MonkeyPatch) -> KafkaTransport:
    monkeypatch.setattr(producer_module, "Producer", _StandIn)
    made.clear()
    transport = KafkaTransport(Settings(bootstrap_servers="localhost:1"))
    transport.produce("t", b"v", None, lambda error, message: None)
    return transport


def test_close_waits_for_a_poll_in_progress_and_no_poll_comes_after(
    transport: KafkaTransport,
) -> None:
    [producer] = made
    producer.hold = True
    assert producer.in_poll.wait(5)
    closer = threading.Thread(target=transport.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # the producer is not released under the poll
    producer.release.set()
    closer.join(5)
    assert not closer.is_alive()
    # close() joined the thread: it has ended, so no poll of it can come after.
    background = {t for t in producer.pollers if t.name == THREAD}
    assert background
    assert not any(thread.is_alive() for thread in background)
    assert not _poll_threads() & background


def test_the_thread_stays_out_while_the_application_serves_the_producer(
    transport: KafkaTransport, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread's turns come on time; the clock it reads says whether the application served
    the producer within half a turn (frozen here: served just now, until the test moves it)."""
    clock = [1000.0]
    monkeypatch.setattr(transport_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    [producer] = made
    turns = threading.Semaphore(0)
    transport.add_poll_hook(turns.release)  # after every turn, a skipped one too
    transport.poll(0)  # an enqueue loop serving its reports: at 1000.0
    for _ in range(3):
        assert turns.acquire(timeout=5)
    assert producer.background_polls() == 0
    clock[0] += transport_module.POLL_EVERY_S  # the application stopped serving it
    assert wait_for(lambda: producer.background_polls() > 0, timeout=5)
    transport.close()


def _failure(job_id: str, code: int = KafkaError._MSG_TIMED_OUT) -> PipelineFailure:
    return PipelineFailure(job_id, "acme.jobs.default", code, "Local: Message timed out")


def test_failures_are_told_in_one_line_at_most_every_interval_and_kept_for_flush(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = Settings(bootstrap_servers="kafka:9092", producer={"delivery_timeout_s": 30})
    log = FailureLog()
    generation = log.sending(14)
    for n in range(12):
        log.answer(generation, _failure(f"job-{n}"))
    log.answer(
        generation, PipelineFailure("refused", "acme.jobs.default", 29, "Broker: Not authorized")
    )
    log.answer(generation)
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        log.tell(settings, now=100.0)
        log.answer(generation, _failure("later"))
        log.tell(settings, now=105.0)  # within the interval: waits
        assert len(caplog.records) == 1
        log.tell(settings, now=110.0)
    first, second = (r.getMessage() for r in caplog.records)
    assert first.startswith("13 enqueued job(s) never reached Kafka at kafka:9092")
    assert "not acknowledged within the delivery timeout of 30s" in first
    assert "Broker: Not authorized" in first
    assert "job-0, job-1" in first
    assert "job-9 and 3 more" in first
    assert second.startswith("1 enqueued job(s)")
    assert "later" in second
    assert "job-0" not in second
    assert log.unanswered() == 0
    assert len(log.take(log.mark()).failures) == 14  # flush() still raises every one


def test_the_exit_report_names_only_the_failures_not_logged_yet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job the polling thread logged as lost was named again by the exit report."""
    settings = Settings(bootstrap_servers="kafka:9092")
    log = FailureLog()
    generation = log.sending(2)
    log.answer(generation, _failure("told"))
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        log.tell(settings, now=100.0)
    log.answer(generation, _failure("not-told"))
    assert [f.job_id for f in log.unreported().failures] == ["not-told"]
    assert not log.unreported()


def test_failures_a_call_raised_are_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(namespace="acme")
    log = FailureLog()
    log.answer(log.sending(), _failure("flushed"))
    log.take(log.mark())  # flush() raised it
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Not authorized")

    class _Refuses(InMemoryTransport):
        def poll(self, timeout: float = 0) -> int:
            handle._on_delivery(refused, Message(topic="acme.jobs.default", value=b""))
            return 1

    handle = JobHandle(_Refuses(), settings, log, job_id="waited")
    with pytest.raises(EnqueueError):
        handle.wait(timeout=1)
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        log.tell(settings)
    assert caplog.records == []
    assert not log.unreported()


def test_answers_from_many_threads_are_all_counted() -> None:
    log = FailureLog()
    generation = log.sending(80_000)

    def answer() -> None:
        for _ in range(20_000):
            log.answer(generation)

    threads = [threading.Thread(target=answer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert generation.answered == 80_000
    assert log.unanswered() == 0
