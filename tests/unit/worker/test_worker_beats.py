"""The worker's heartbeat publisher without a broker: what it writes, the tombstone, the
utilization average, a missing topic, and each process's own client id."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline import Settings
from pipeline._workerbeats import decode_beat
from pipeline_worker._beats import Counters, Heartbeats, process_client_id


class FakeTopics:
    def __init__(self, names: list[str]) -> None:
        self.topics = {name: type("Meta", (), {"error": None})() for name in names}


class FakeProducer:
    def __init__(self, topics: list[str]) -> None:
        self.produced: list[tuple[str, bytes | None, bytes]] = []
        self.callbacks: list[Any] = []
        self.topics = topics
        self.three = threading.Event()
        """Set once three records were produced."""

    def produce(self, topic: str, value: bytes | None, key: bytes, on_delivery: Any) -> None:
        self.produced.append((topic, value, key))
        self.callbacks.append(on_delivery)
        if len(self.produced) >= 3:
            self.three.set()

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def list_topics(self, timeout: float) -> FakeTopics:
        return FakeTopics(self.topics)


def publisher(producer: FakeProducer, in_flight: list[int], interval: float = 0.05) -> Heartbeats:
    settings = Settings(namespace="ns", worker={"heartbeat_interval_s": interval, "concurrency": 4})
    counters = Counters(lambda: in_flight[0], lambda: 7, lambda: [("ns.jobs.low", 1)])
    return Heartbeats(
        settings,
        client_id="w-1",
        group="ns.workers",
        counters=counters,
        producer_factory=lambda conf: producer,
    )


def test_it_publishes_at_once_and_every_interval_then_a_tombstone() -> None:
    producer = FakeProducer(["ns.workers"])
    in_flight = [2]
    beats = publisher(producer, in_flight)

    async def run() -> None:
        task = asyncio.create_task(beats.run())
        assert await asyncio.to_thread(producer.three.wait, 10)
        task.cancel()

    asyncio.run(run())
    beats.close()
    topic, value, key = producer.produced[0]
    assert (topic, key) == ("ns.workers", b"w-1")
    first = decode_beat("w-1", value)
    assert first is not None
    assert (first.in_flight, first.concurrency, first.utilization) == (2, 4, 0.5)
    assert first.jobs_done == 7
    assert first.partitions == (("ns.jobs.low", 1),)
    assert first.group == "ns.workers"
    assert producer.produced[-1] == ("ns.workers", None, b"w-1")


def test_utilization_is_the_average_of_the_samples_since_the_last_heartbeat() -> None:
    in_flight = [0]
    beats = publisher(FakeProducer(["ns.workers"]), in_flight)
    beats._samples.extend([4, 4, 0, 0])  # busy half the interval
    in_flight[0] = 1
    taken = beats.beat()
    assert taken.utilization == 0.5
    assert taken.in_flight == 1  # the current count
    beats._samples.clear()
    in_flight[0] = 9  # over the concurrency (a job type's own limit): capped at 1
    assert beats.beat().utilization == 1.0


def test_a_missing_topic_warns_once_and_publishes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = FakeProducer(["ns.jobs.high"])
    beats = publisher(producer, [0])
    with caplog.at_level(logging.WARNING, logger="pipeline.worker.beats"):
        asyncio.run(beats.run())
        beats.close()
    assert producer.produced == []
    assert beats.off
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "ns.workers does not exist" in warnings[0]
    assert "pipeline topics apply" in warnings[0]


def test_a_delivery_to_an_unknown_topic_turns_heartbeats_off_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = FakeProducer(["ns.workers"])
    beats = publisher(producer, [0])
    beats.publish()
    beats.publish()
    unknown = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
    with caplog.at_level(logging.WARNING, logger="pipeline.worker.beats"):
        for callback in producer.callbacks:
            callback(unknown, None)
    assert beats.off
    assert len(caplog.records) == 1
    beats.close()
    assert all(value is not None for _, value, _ in producer.produced)  # no tombstone


def test_each_worker_process_has_its_own_client_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pipeline_worker._beats.socket.gethostname", lambda: "box")
    monkeypatch.setattr("pipeline_worker._beats.os.getpid", lambda: 4242)
    monkeypatch.setattr("pipeline_worker._beats._workers_in_process", iter([1, 1, 1, 2]))
    assert process_client_id(Settings()) == "pipeline-box-4242"
    assert process_client_id(Settings(client_id="billing-worker")) == "billing-worker"
    assert process_client_id(Settings(client_id="billing-worker"), 3) == "billing-worker-3"
    assert process_client_id(Settings()) == "pipeline-box-4242-2"  # a second worker in-process


def test_the_record_is_small() -> None:
    beats = publisher(FakeProducer(["ns.workers"]), [1])
    beats.publish()
    assert len(json.dumps(json.loads(beats._producer.produced[0][1]))) < 400
