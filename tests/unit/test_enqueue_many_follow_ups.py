"""``enqueue_many`` in a running job: its follow-ups go to the producer a batch at a time, and a
producer that raises part way through one tells how many it took, which the job counts exactly."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from confluent_kafka import KafkaError, KafkaException

import pipeline._producer as producer_module
import pipeline._transport as transport_module
from pipeline import Pipeline, PipelineError, Settings, _enqueuemany
from pipeline._followups import RUNNING, FollowUps
from pipeline._producer import KafkaTransport
from pipeline._transport import DeliveryCallback
from pipeline.testing import InMemoryTransport

FATAL = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence lost", fatal=True)
REFUSED = KafkaError(KafkaError.INVALID_RECORD, "the broker refused it")


@dataclass
class _Job:
    """A job the worker runs, as an enqueue in its context sees it."""

    finished: bool = False
    follow_ups: FollowUps | None = None


def _in_job(job: _Job, call: Callable[[], Any]) -> Any:
    def run() -> Any:
        RUNNING.set(job)
        return call()

    return contextvars.copy_context().run(run)


class _StandIn:
    """librdkafka's Producer as KafkaTransport uses it: takes ``takes`` jobs (the next
    producer made, the next number), then raises ``then``."""

    plan: ClassVar[list[tuple[int, KafkaError]]] = []
    made: ClassVar[list[_StandIn]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.takes, self.then = self.plan.pop(0) if self.plan else (10**9, REFUSED)
        self.taken: list[bytes] = []
        self.made.append(self)

    def __len__(self) -> int:
        return 0

    def produce(self, topic: str, value: bytes, key: bytes | None, *, on_delivery: Any) -> None:
        if len(self.taken) >= self.takes:
            raise KafkaException(self.then)
        self.taken.append(value)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipeline]:
    monkeypatch.setattr(producer_module, "Producer", _StandIn)
    monkeypatch.setattr(transport_module, "POLL_EVERY_S", 3600.0)  # the test polls, alone
    _StandIn.plan, _StandIn.made = [], []
    app = Pipeline(Settings(namespace="acme", bootstrap_servers="localhost:1"))
    assert isinstance(app._transport, KafkaTransport)
    yield app
    app._transport.close()


class _TakesSome(InMemoryTransport):
    """The in-memory transport (no ``produce_many``) that takes ``takes`` jobs, then raises;
    it answers for none until ``answering``."""

    def __init__(self, takes: int) -> None:
        super().__init__()
        self.takes = takes
        self.answering = False

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        if len(self._pending) >= self.takes:
            raise BufferError("Local: Queue full")
        super().produce(topic, value, key, on_delivery)

    def poll(self, timeout: float = 0) -> int:
        return super().poll(timeout) if self.answering else 0


def _enqueue_in_job(
    app: Pipeline, jobs: int, raises: type[Exception], match: str
) -> tuple[_Job, Exception]:
    job = _Job()

    def enqueue() -> None:
        app.enqueue_many("child", ({"n": n} for n in range(jobs)))

    with pytest.raises(raises, match=match) as caught:
        _in_job(job, enqueue)
    return job, caught.value


def _pending(job: _Job) -> int:
    assert job.follow_ups is not None
    return job.follow_ups._pending


@pytest.mark.parametrize("takes", [0, 1, 3, 4, 5])
def test_the_in_memory_producer_raising_part_way_leaves_the_jobs_it_took_counted(
    monkeypatch: pytest.MonkeyPatch, takes: int
) -> None:
    monkeypatch.setattr(_enqueuemany, "BATCH", 4)
    transport = _TakesSome(takes)
    job, error = _enqueue_in_job(Pipeline(transport=transport), 6, BufferError, "Queue full")
    assert _pending(job) == takes
    taken_ids = error.enqueued_ids  # type: ignore[attr-defined]
    assert len(taken_ids) == takes
    transport.answering = True
    transport.poll()  # Kafka acknowledges the jobs the producer took: the job ends
    assert job.follow_ups is not None
    assert job.follow_ups.answered_all
    assert [j.id for j in transport.jobs("pipeline.jobs.default")] == taken_ids


@pytest.mark.parametrize("takes", [0, 600, 999])
def test_a_kafka_producer_refusing_part_way_leaves_the_jobs_it_took_counted(
    kafka: Pipeline, takes: int
) -> None:
    _StandIn.plan = [(takes, REFUSED)]
    job, raised = _enqueue_in_job(kafka, 1000, PipelineError, "the broker refused it")
    assert _pending(job) == takes
    [producer] = _StandIn.made
    assert len(raised.enqueued_ids) == len(producer.taken) == takes  # type: ignore[attr-defined]
    [note] = raised.__notes__
    assert f"sent the {takes} job(s) of the batch before this error" in note


def test_a_new_producer_refusing_what_a_failed_one_left_counts_what_both_took(
    kafka: Pipeline,
) -> None:
    _StandIn.plan = [(300, FATAL), (200, REFUSED)]  # fails for good, then its successor refuses
    job, _ = _enqueue_in_job(kafka, 1000, PipelineError, "the broker refused it")
    failed, fresh = _StandIn.made
    assert (len(failed.taken), len(fresh.taken)) == (300, 200)
    assert _pending(job) == 500


def test_a_running_job_hands_its_follow_ups_to_the_producer_a_batch_a_call(
    kafka: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = kafka._transport
    assert isinstance(transport, KafkaTransport)
    calls: list[int] = []
    produce_many = transport.produce_many

    def counted(topic: str, values: list[bytes], *args: Any) -> None:
        calls.append(len(values))
        produce_many(topic, values, *args)

    monkeypatch.setattr(transport, "produce_many", counted)
    job = _Job()
    ids = _in_job(job, lambda: kafka.enqueue_many("child", ({"n": n} for n in range(2500))))
    assert calls == [1000, 1000, 500]  # not one call per job
    assert _pending(job) == len(ids) == 2500


def test_a_subclass_that_overrides_produce_many_is_not_taken_to_tell() -> None:
    """Its override may say nothing of what it took: a running job must then hand it one job
    a call, as any transport that does not say so."""

    class Own(KafkaTransport):
        def produce_many(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError

    class Telling(Own):
        tells_taken = True

    settings = Settings()
    assert KafkaTransport(settings).tells_taken
    assert not Own(settings).tells_taken
    assert Telling(settings).tells_taken
