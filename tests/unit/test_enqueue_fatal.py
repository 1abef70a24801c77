"""A producer that fails for good (a librdkafka fatal error) is replaced, and its jobs' callers
are told the cause: against a stand-in librdkafka that fails as confluent-kafka does.

confluent-kafka never hands a fatal error to ``error_cb``: it raises it, once, from the next
``poll()`` or ``flush()`` that serves it; from then on ``produce()`` refuses every message with
``_FATAL``, and the messages still queued come back purged (librdkafka's own behaviour, seen
against a real broker in tests/integration/test_enqueue_fatal.py).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message

import pipeline._producer as producer_module
import pipeline._transport as transport_module
from pipeline import EnqueueError, Pipeline, PipelineError, Settings
from pipeline._errors import ProducerFatalError
from pipeline._producer import KafkaTransport

CAUSE = KafkaError(
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "the broker lost the sequence", fatal=True
)
made: list[_FailingProducer] = []


class _FailingProducer:
    """librdkafka's Producer as KafkaTransport uses it: it acknowledges what it holds when
    served, until :meth:`fail`; ``fail_after``: it fails by itself once it took that many."""

    fail_after: int | None = None

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.queued: list[tuple[Message, Any]] = []
        self.acknowledged: list[bytes] = []
        self.fatal: KafkaError | None = None
        self._untold: KafkaError | None = None
        self.taken = 0
        self.refusals = 0
        self.refuse_with: KafkaError | None = None
        """A local error (not fatal) ``produce`` raises for every message."""
        made.append(self)

    def fail(self, error: KafkaError = CAUSE) -> None:
        """Fail for good: raise ``error`` from the next poll or flush, purge the queue."""
        self.fatal = self._untold = error

    def __len__(self) -> int:
        return len(self.queued) + (self._untold is not None)

    def produce(self, topic: str, value: bytes, key: bytes | None, *, on_delivery: Any) -> None:
        if self.fatal is not None or self.refuse_with is not None:
            self.refusals += 1
            raise KafkaException(
                self.refuse_with
                or KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error")
            )
        self.queued.append((Message(topic=topic, value=value, key=key), on_delivery))
        self.taken += 1
        if self.fail_after is not None and self.taken >= self.fail_after:
            self.fail()

    def poll(self, timeout: float = 0) -> int:
        if self._untold is not None:
            error, self._untold = self._untold, None
            raise KafkaException(error)
        queued, self.queued = self.queued, []
        for message, on_delivery in queued:
            if self.fatal is None:
                self.acknowledged.append(message.value() or b"")
                on_delivery(None, message)
            else:
                on_delivery(KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue"), message)
        return len(queued)

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return len(self)

    def purge(self) -> None:
        self.fatal = self.fatal or KafkaError(KafkaError._PURGE_QUEUE)


@pytest.fixture(autouse=True)
def _stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(producer_module, "Producer", _FailingProducer)
    monkeypatch.setattr(transport_module, "POLL_EVERY_S", 3600.0)  # the test polls, alone
    _FailingProducer.fail_after = None
    made.clear()


def _app() -> Pipeline:
    app = Pipeline(Settings(namespace="acme", bootstrap_servers="localhost:1"))
    assert isinstance(app._transport, KafkaTransport)
    return app


def _ids(producer: _FailingProducer) -> list[str]:
    from pipeline._delivery import job_id_of

    return [job_id_of(value) for value in producer.acknowledged]


def test_the_next_enqueue_works_on_a_new_producer_and_flush_names_the_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app()
    held = [app.enqueue("t", {"n": n}) for n in range(3)]
    [failed] = made
    failed.fail()
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        after = app.enqueue("t", {"n": 3})  # refused by the failed producer: a new one takes it
    failed_first, fresh = made
    assert failed_first is failed
    assert failed.refusals == 1  # asked once: its refusal is not tried on it again
    assert len(fresh.queued) == 1
    [line] = caplog.records
    assert "failed for good (OUT_OF_ORDER_SEQUENCE_NUMBER: the broker lost the sequence)" in (
        line.getMessage()
    )
    with pytest.raises(ProducerFatalError) as caught:
        app.flush()
    error = caught.value
    assert isinstance(error, EnqueueError)
    assert isinstance(error, PipelineError)
    assert error.job_id in held
    assert error.cause == "OUT_OF_ORDER_SEQUENCE_NUMBER: the broker lost the sequence"
    assert "the producer failed for good (OUT_OF_ORDER_SEQUENCE_NUMBER" in str(error)
    assert "(and 2 more)" in str(error.__cause__)
    assert _ids(fresh) == [after]
    app.flush()  # told once; the new producer works
    app.enqueue("t", {"n": 4})
    app.flush()
    assert len(made) == 2
    assert not app._transport._retired  # type: ignore[attr-defined]  # released once drained


def test_a_handle_of_a_job_the_failed_producer_held_raises_the_cause() -> None:
    app = _app()
    handle = app.submit("t", {"n": 1})
    made[0].fail()
    with pytest.raises(ProducerFatalError, match="OUT_OF_ORDER_SEQUENCE_NUMBER") as caught:
        handle.wait(timeout=5)
    assert caught.value.job_id == handle.job_id
    assert app.submit("t", {"n": 2}).wait(timeout=5).job_id in _ids(made[1])
    app.flush()  # the failure wait() raised is not told again


def test_a_fatal_error_served_between_jobs_fails_no_enqueue() -> None:
    # enqueue() serves delivery reports every 1,000 jobs: the fatal error comes out of that poll.
    _FailingProducer.fail_after = 1500
    app = _app()
    ids = [app.enqueue("t", {"n": n}) for n in range(3000)]
    failed, fresh = made
    with pytest.raises(ProducerFatalError) as caught:
        app.flush()
    lost = set(ids) - set(_ids(failed)) - set(_ids(fresh))
    assert caught.value.job_id in lost
    assert f"(and {len(lost) - 1} more)" in str(caught.value.__cause__)
    assert _ids(failed) == ids[:1000]  # acknowledged before it failed
    assert _ids(fresh) == [i for i in ids if i not in lost and i not in ids[:1000]]


def test_enqueue_many_hands_what_the_failed_producer_did_not_take_to_a_new_one() -> None:
    _FailingProducer.fail_after = 1500  # in the middle of the second batch of 1,000
    app = _app()
    ids = app.enqueue_many("t", ({"n": n} for n in range(2500)))
    failed, fresh = made
    assert failed.taken == 1500
    with pytest.raises(ProducerFatalError) as caught:
        app.flush()
    assert caught.value.job_id in ids[1000:1500]
    assert "(and 499 more)" in str(caught.value.__cause__)
    assert _ids(failed) == ids[:1000]
    assert _ids(fresh) == ids[1500:]


def test_the_exit_report_names_the_cause(caplog: pytest.LogCaptureFixture) -> None:
    app = _app()
    held = app.enqueue("t", {"n": 1})
    made[0].fail()
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._flush_at_exit()
    message = caplog.records[-1].getMessage()
    assert message.startswith("1 enqueued job(s) never reached Kafka")
    assert "(the producer failed for good: OUT_OF_ORDER_SEQUENCE_NUMBER" in message
    assert held in message
    with pytest.raises(ProducerFatalError):  # logged, not raised: a flush still raises it
        app.close()


def test_a_keyed_job_waits_for_what_the_failed_producer_still_holds() -> None:
    app = _app()
    first = app.enqueue("t", {"n": 1}, key="k")
    made[0].fail()
    app._transport.poll(0)  # the fatal error is served: the producer is retired, job 1 held
    assert len(made[0].queued) == 1
    app.enqueue("t", {"n": 2}, key="k")
    assert not made[0].queued  # flushed before the new producer took the keyed job
    assert len(made[1].queued) == 1
    with pytest.raises(ProducerFatalError) as caught:
        app.close()
    assert caught.value.job_id == first


def test_a_forked_child_forgets_the_failed_producers_too(monkeypatch: pytest.MonkeyPatch) -> None:
    kept: list[object] = []
    monkeypatch.setattr(producer_module, "_never_destroy", kept.append)
    app = _app()
    app.enqueue("t", {"n": 1})
    made[0].fail()
    app.enqueue("t", {"n": 2})
    transport = app._transport
    assert isinstance(transport, KafkaTransport)
    transport._forget_parents_producers()
    app._failures._forget_the_parents()  # as a fork does: the parent's jobs are the parent's
    assert kept == [made[1], made[0]]  # never destroyed in the child: the parent's threads
    assert transport._all() == []
    app.enqueue("t", {"n": 3})
    assert len(made) == 3
    app.close()


def test_a_job_the_producer_refuses_without_failing_for_good_is_an_error_asked_once() -> None:
    app = _app()
    app.enqueue("t", {"n": 0})
    [producer] = made
    producer.refuse_with = KafkaError(KafkaError._UNKNOWN_PARTITION, "Local: Unknown partition")
    with pytest.raises(PipelineError, match=r"cannot produce to acme\.jobs\.default: .*Unknown"):
        app.enqueue("t", {"n": 1})
    assert producer.refusals == 1
    assert made == [producer]  # not replaced: it works, it refused this job
