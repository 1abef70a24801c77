"""The worker's heartbeat publisher without a broker: what it writes, the tombstone, the
utilization average, a missing topic (and a delivery error that only says so), its own key
where replicas share a client id, and each process's own client id."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline import Settings
from pipeline._backlogmodel import GroupMember, GroupMembers
from pipeline._status import StatusSnapshot
from pipeline._workerbeats import beat_key, decode_beat, read_process_beats, read_worker_beats
from pipeline_worker._beats import Counters, Heartbeats, process_client_id
from tests.waiting import wait_for

UNKNOWN = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)


class FakeTopics:
    def __init__(self, names: list[str]) -> None:
        self.topics = {name: type("Meta", (), {"error": None})() for name in names}


class FakeProducer:
    """Records what is produced; :meth:`poll` serves the delivery reports, each with
    :attr:`failing` (None: delivered), as librdkafka does."""

    def __init__(self, topics: list[str]) -> None:
        self.produced: list[tuple[str, bytes | None, bytes]] = []
        self.topics = topics
        self.failing: KafkaError | None = None
        self.metadata_calls = 0
        self._reports: list[Any] = []
        self._changed = threading.Condition()

    def produce(self, topic: str, value: bytes | None, key: bytes, on_delivery: Any) -> None:
        with self._changed:
            self.produced.append((topic, value, key))
            self._reports.append(on_delivery)
            self._changed.notify_all()

    def wait_produced(self, count: int, timeout: float) -> bool:
        """Whether ``count`` records were produced within ``timeout`` seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: len(self.produced) >= count, timeout)

    def poll(self, timeout: float = 0) -> int:
        reports, self._reports = self._reports, []
        for report in reports:
            report(self.failing, None)
        return len(reports)

    def flush(self, timeout: float) -> int:
        self.poll()
        return 0

    def list_topics(self, timeout: float) -> FakeTopics:
        self.metadata_calls += 1
        return FakeTopics(self.topics)


def publisher(
    producer: FakeProducer,
    in_flight: list[int],
    interval: float = 0.05,
    client_id: str = "w-1",
    member_id: Callable[[], str | None] = lambda: None,
) -> Heartbeats:
    settings = Settings(namespace="ns", worker={"heartbeat_interval_s": interval, "concurrency": 4})
    counters = Counters(lambda: in_flight[0], lambda: 7, lambda: [("ns.jobs.low", 1)], member_id)
    return Heartbeats(
        settings,
        client_id=client_id,
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
        assert await asyncio.to_thread(producer.wait_produced, 3, 10)
        task.cancel()

    asyncio.run(run())
    beats.close()
    topic, value, key = producer.produced[0]
    assert (topic, key) == ("ns.workers", beats.key)
    first = decode_beat(key.decode(), value)
    assert first is not None
    assert (first.in_flight, first.concurrency, first.utilization) == (2, 4, 0.5)
    assert first.jobs_done == 7
    assert first.partitions == (("ns.jobs.low", 1),)
    assert first.group == "ns.workers"
    assert producer.produced[-1] == ("ns.workers", None, beats.key)


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


async def published_until(
    producer: FakeProducer, beats: Heartbeats, count: int, timeout: float = 5.0
) -> bool:
    """Run ``beats`` until ``count`` records were produced (or ``timeout``); whether they were."""
    task = asyncio.create_task(beats.run())
    try:
        return await asyncio.to_thread(producer.wait_produced, count, timeout)
    finally:
        task.cancel()


def test_a_missing_topic_warns_once_publishes_nothing_and_resumes_once_it_exists(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("pipeline_worker._beats.RECHECK_S", 0.0, raising=False)
    producer = FakeProducer(["ns.jobs.high"])
    beats = publisher(producer, [0])

    async def run() -> None:
        task = asyncio.create_task(beats.run())
        assert await asyncio.to_thread(wait_for, lambda: producer.metadata_calls >= 3, 5)
        assert producer.produced == []  # looked again, twice: still missing, nothing sent
        assert beats.off
        producer.topics = ["ns.workers"]  # `pipeline topics apply`
        assert await asyncio.to_thread(producer.wait_produced, 2, 5)
        task.cancel()

    with caplog.at_level(logging.INFO, logger="pipeline.worker.beats"):
        asyncio.run(run())
        beats.close()
    assert not beats.off
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings
    assert "ns.workers does not exist" in warnings[0]
    assert "pipeline topics apply" in warnings[0]
    assert warnings[1] == "topic ns.workers exists now: heartbeats resume"
    assert producer.produced[-1] == ("ns.workers", None, beats.key)  # a clean stop's tombstone


def test_an_unknown_topic_delivery_error_does_not_stop_heartbeats_while_the_topic_exists(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = FakeProducer(["ns.workers"])
    producer.failing = UNKNOWN  # metadata settling after `topics apply`, a broker restarting
    beats = publisher(producer, [0])
    with caplog.at_level(logging.INFO, logger="pipeline.worker.beats"):
        assert asyncio.run(published_until(producer, beats, 5)), producer.produced
    assert not beats.off
    # The cluster was asked once at the start and once after the first error, no more:
    # every report failed, but later checks wait for RECHECK_S.
    assert producer.metadata_calls == 2
    assert [r.getMessage() for r in caplog.records] == [
        "a heartbeat found no topic ns.workers, but it exists: heartbeats go on"
    ]


def test_heartbeats_stop_when_the_cluster_confirms_the_topic_is_gone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("pipeline_worker._beats.RECHECK_S", 0.0, raising=False)
    producer = FakeProducer(["ns.workers"])
    beats = publisher(producer, [0])

    async def run() -> int:
        task = asyncio.create_task(beats.run())
        assert await asyncio.to_thread(producer.wait_produced, 2, 5)
        producer.topics = []  # the topic was deleted
        producer.failing = UNKNOWN
        assert await asyncio.to_thread(wait_for, lambda: beats.off, 5)
        sent = len(producer.produced)
        calls = producer.metadata_calls
        assert await asyncio.to_thread(wait_for, lambda: producer.metadata_calls > calls + 2, 5)
        task.cancel()
        return sent

    with caplog.at_level(logging.WARNING, logger="pipeline.worker.beats"):
        sent = asyncio.run(run())
        beats.close()
    assert len(producer.produced) == sent  # nothing more, not even a tombstone
    assert len(caplog.records) == 1
    assert "ns.workers does not exist" in caplog.records[0].getMessage()


def test_replicas_sharing_a_client_id_keep_and_tombstone_their_own_heartbeats(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two pods of one Deployment with PIPELINE_CLIENT_ID=w-1: each pid 1, on its own host.
    monkeypatch.setattr("pipeline_worker._beats.os.getpid", lambda: 1)
    producer = FakeProducer(["ns.workers"])
    replicas = []
    for host, busy in (("pod-a", 1), ("pod-b", 3)):
        monkeypatch.setattr("pipeline_worker._beats.socket.gethostname", lambda host=host: host)
        replicas.append(publisher(producer, [busy]))
    for beats in replicas:
        beats.publish()
    keys = [key for _, _, key in producer.produced]
    assert keys == [b"w-1@pod-a:1", b"w-1@pod-b:1"]
    assert beat_key("w-1", "pod-a", 1) == "w-1@pod-a:1"

    table = [(key.decode(), value) for _, value, key in producer.produced]
    monkeypatch.setattr("pipeline._workerbeats.read_table", lambda *args, **kwargs: table)
    settings = Settings(namespace="ns")
    read = read_process_beats(settings)
    assert {key: beat.in_flight for key, beat in read.items()} == {
        "w-1@pod-a:1": 1,
        "w-1@pod-b:1": 3,
    }
    # Both fresh under one client id: no member can be told apart, so neither is shown as
    # the client id's (rather than one pod's numbers for both).
    assert read_worker_beats(settings) == {}

    replicas[0].close()  # pod-a stops cleanly
    table = [(key.decode(), value) for _, value, key in producer.produced]
    assert table[-1] == ("w-1@pod-a:1", None)
    assert list(read_process_beats(settings)) == ["w-1@pod-b:1"]  # pod-b's record is kept
    assert read_worker_beats(settings)["w-1"].host == "pod-b"


def test_each_heartbeat_carries_its_consumers_member_id_once_it_joined() -> None:
    answers: list[str | None] = [None, "", "m-1", "m-2"]
    producer = FakeProducer(["ns.workers"])
    beats = publisher(producer, [1], member_id=lambda: answers.pop(0))
    for _ in range(4):
        beats.publish()
    decoded = [decode_beat(key.decode(), value) for _, value, key in producer.produced]
    # Not joined yet (None, then ""), joined, joined again with another id (a rejoin).
    assert [beat.member_id for beat in decoded if beat is not None] == ["", "", "m-1", "m-2"]


def test_status_tells_replicas_sharing_a_client_id_apart_by_member_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pipeline_worker._beats.os.getpid", lambda: 1)
    producer = FakeProducer(["ns.workers"])
    for host, busy, member in (("pod-a", 1, "m-a"), ("pod-b", 3, "m-b")):
        monkeypatch.setattr("pipeline_worker._beats.socket.gethostname", lambda host=host: host)
        replica = publisher(producer, [busy], member_id=functools.partial(str, member))
        replica.publish()
    table = [(key.decode(), value) for _, value, key in producer.produced]
    monkeypatch.setattr("pipeline._workerbeats.read_table", lambda *args, **kwargs: table)
    beats = read_process_beats(Settings(namespace="ns"))
    members = (
        GroupMember("w-1", "10.0.0.8", (("ns.jobs.low", 1),), "m-b"),
        GroupMember("w-1", "10.0.0.7", (("ns.jobs.low", 0),), "m-a"),
    )
    at = max(beat.at_ms for beat in beats.values())
    nobody = GroupMembers("ns.scheduler", "EMPTY", ())
    workers = GroupMembers("ns.workers", "STABLE", members)
    taken = StatusSnapshot("ns", at, (), (), (), workers, nobody, 0, (), worker_beats=beats)
    shown = [taken.beat_of(member) for member in members]
    assert [(b.host, b.in_flight) for b in shown if b is not None] == [("pod-b", 3), ("pod-a", 1)]


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
