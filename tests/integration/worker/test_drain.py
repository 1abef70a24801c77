"""Draining a backlog: every job runs exactly once and the commits reach the end offsets."""

from __future__ import annotations

import os
import random
import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import KafkaError, Message, Producer

from pipeline import Job, Pipeline, Priority

from .harness import CommitAuditor, TopicPartitionKey, auditing, check_ran, enqueue
from .scenarios import max_overlap

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_20000_jobs_over_4_priorities_each_run_once_and_commits_reach_the_end(
    kit: WorkerKit,
) -> None:
    ids: list[str] = []
    for index, priority in enumerate(Priority):
        # Half the priorities run plain functions (thread pool), half coroutines (event loop).
        job_type = "sleepy" if index % 2 == 0 else "sleepy_async"
        # 50 keys per priority spread the jobs over every partition (unkeyed jobs go to sticky
        # batches that may miss one); keys mean nothing to a worker without --key-ordering.
        for chunk in range(50):
            ids += enqueue(
                kit.producer,
                job_type,
                100,
                first=index * 5000 + chunk * 100,
                fields={"max_ms": 5.0},
                priority=priority,
                key=f"{priority.value}-{chunk}",
            )
    job_topics = kit.topics.all_jobs()
    ends = kit.offsets.ends(job_topics)
    assert len(ends) == 24, f"expected 4 topics x 6 partitions, got {sorted(ends)}"
    assert all(end > 0 for end in ends.values()), f"some partitions got no job: {ends}"

    with auditing(CommitAuditor(kit.offsets, kit.recording, job_topics)) as auditor:
        worker = kit.workers.start("--concurrency", "50", "--burst")
        code = worker.wait(timeout=300)

    assert code == 0, worker.log_tail()
    assert check_ran(kit.recording, ids, exactly_once=True) == []
    assert kit.offsets.lag(job_topics) == {}
    auditor.assert_clean()
    events = kit.recording.events
    assert max_overlap(events) <= 50, "more jobs ran at once than --concurrency allows"
    # Many jobs in flight per partition, not one partition = one job at a time.
    assert max_overlap(events, by_partition=True) >= 2


def _garbage(producer: Pipeline, rng: random.Random) -> list[bytes | None]:
    """Values a worker must survive: noise, empty, tombstones, broken or foreign jobs."""
    valid = producer.codec.encode(Job(id=uuid.uuid4().hex, type="noop", payload=b'{"n": -1}'))
    unknown_type = producer.codec.encode(Job(id=uuid.uuid4().hex, type="no.such", payload=b"{}"))
    return [
        os.urandom(rng.randint(1, 200)),
        b"",
        None,
        b"\xc3\x01" + os.urandom(8) + os.urandom(rng.randint(0, 50)),  # unknown fingerprint
        valid[: rng.randint(1, len(valid) - 1)],  # truncated
        valid[:10] + os.urandom(len(valid) - 10),  # right fingerprint, corrupt body
        unknown_type,
        b'{"type": "noop", "payload": {"n": 1}}',  # JSON, not the wire format
    ]


def test_undecodable_messages_between_jobs_do_not_stop_the_worker(kit: WorkerKit) -> None:
    topic = kit.topics.jobs(Priority.DEFAULT)
    rng = random.Random(3)
    raw = Producer({**kit.settings.client_config(), "enable.idempotence": True, "acks": "all"})
    skip: dict[TopicPartitionKey, set[int]] = {}
    failures: list[str] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        partition, offset = message.partition(), message.offset()
        if error is not None or partition is None or offset is None:
            failures.append(str(error))
            return
        skip.setdefault((topic, partition), set()).add(offset)

    ids: list[str] = []
    for round_ in range(4):
        ids += enqueue(kit.producer, "noop", 60, first=round_ * 60, priority=Priority.DEFAULT)
        for partition in range(6):
            for value in _garbage(kit.producer, rng):
                raw.produce(topic, value=value, partition=partition, on_delivery=delivered)
        assert raw.flush(30) == 0
    assert not failures, failures
    assert sum(map(len, skip.values())) == 4 * 6 * 8

    with auditing(CommitAuditor(kit.offsets, kit.recording, [topic], skip=skip)) as auditor:
        worker = kit.workers.start("--concurrency", "20", "--burst")
        code = worker.wait(timeout=120)

    assert code == 0, worker.log_tail()
    assert check_ran(kit.recording, ids, exactly_once=True) == []
    assert kit.offsets.lag([topic]) == {}, "the commits stopped short of the partitions' ends"
    auditor.assert_clean()
