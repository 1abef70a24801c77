"""Lifecycle events are best effort: a producer that refuses one never fails the job path."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from prometheus_client.registry import CollectorRegistry

from pipeline import Job, JobCodec, Settings
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._metricsexport import Gauges, WorkerCollector
from pipeline_worker.route.events import EventStream


class RefusingProducer:
    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.polled = 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        raise self.error

    def poll(self, timeout: float) -> int:
        self.polled += 1
        return 0

    def flush(self, timeout: float) -> int:
        return 0


@pytest.mark.parametrize(
    "error",
    [
        BufferError("queue full"),
        KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large")),
        KafkaException(KafkaError(KafkaError._FATAL, "fatal", fatal=True)),
    ],
)
def test_an_event_the_producer_refuses_is_counted_as_dropped(error: BaseException) -> None:
    metrics = WorkerMetrics()
    stream = EventStream(
        Settings(bootstrap_servers="127.0.0.1:1", namespace="unit"), JobCodec(), metrics
    )
    producer = RefusingProducer(error)
    stream._producer = producer  # type: ignore[assignment]
    job = Job(id="job-1", type="t", payload=b"{}")
    stream.started(job)  # raised out of the start of the job before (but for BufferError)
    stream.deduplicated(job)
    assert metrics.events_dropped == 2
    assert producer.polled == 2


def test_an_event_kafka_does_not_take_is_counted_and_exported() -> None:
    """Only the producer's refusals were counted, and nothing exported the count."""
    metrics = WorkerMetrics()
    settings = Settings(
        bootstrap_servers="127.0.0.1:1", namespace="unit", kafka={"message.timeout.ms": "200"}
    )
    stream = EventStream(settings, JobCodec(), metrics)
    stream.started(Job(id="job-1", type="t", payload=b"{}"))
    stream.close(timeout=10.0)  # serves the delivery report: timed out, nobody listens there
    assert metrics.events_dropped == 1
    registry = CollectorRegistry()
    gauges = Gauges(lambda: 0, 1, lambda: 0, lambda: 0, dict, lambda: 0, lambda: 0)
    registry.register(WorkerCollector(metrics, gauges))
    assert registry.get_sample_value("pipeline_events_dropped_total") == 1
