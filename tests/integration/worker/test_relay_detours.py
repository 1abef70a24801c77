"""Tier messages the retry relay cannot return to their priority topic, against real Kafka.

Another producer writes to retry tier 0 (delays 0.5 s and 2 s) what a worker of this
namespace would not: a job larger than the relay's producer sends, or a job due in an hour.
Either stopped the jobs behind it for good (the first also the worker, at every start). Now
the first is dead-lettered (``too_large``) and the second moved to ``<ns>.deferred``, and the
job behind each runs.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer

from pipeline import Job, JobCodec, Settings
from pipeline._admin import apply_topics
from pipeline._deadletters import _Reader, read_dead_letters
from pipeline._records import DeadLetterReason
from tests.waiting import wait_for

from .fixtures import with_retry_tiers

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

RETRY_DELAYS = [0.5, 2.0]
ENV = {"PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS)}
RELAY_MAX_BYTES = 1_000_000
"""What the relay's producer sends (librdkafka's default ``message.max.bytes``)."""


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return with_retry_tiers(bootstrap_servers, namespace, RETRY_DELAYS)


def _noop(n: int, not_before: int | None = None, **fields: object) -> Job:
    payload = json.dumps({"n": n, **fields}).encode()
    return Job(id=str(uuid.uuid4()), type="noop", payload=payload, attempt=2, not_before=not_before)


def _on_tier(kit: WorkerKit, *jobs: Job, tier: int = 0) -> list[bytes]:
    """Write ``jobs`` in order to partition 0 of ``tier``, as a producer allowed messages of up
    to 2 MB (the broker takes up to about 1 MiB); their bytes."""
    codec = JobCodec()
    values = [codec.encode(job) for job in jobs]
    producer = Producer(
        {
            "bootstrap.servers": kit.settings.bootstrap_servers,
            "message.max.bytes": 2_000_000,
            "enable.idempotence": True,
        }
    )
    for value in values:
        producer.produce(kit.topics.retry(tier), value, b"key", partition=0)
    assert producer.flush(30) == 0
    return values


def test_a_retried_job_larger_than_the_relay_sends_is_dead_lettered_and_the_worker_goes_on(
    kit: WorkerKit,
) -> None:
    big = _noop(1, pad="p" * (RELAY_MAX_BYTES + 10_000))
    behind = _noop(2)
    _on_tier(kit, big, behind)
    worker = kit.workers.start("--concurrency", "4", env=ENV)

    assert wait_for(lambda: kit.recording.all_finished([behind.id]), 60), worker.log_tail()
    letters = [stored.letter for stored in read_dead_letters(kit.settings).letters]
    [letter] = letters
    assert letter.reason == DeadLetterReason.TOO_LARGE
    assert (letter.job_id, letter.job, letter.raw_value) == (big.id, None, None)
    tier = kit.topics.retry(0)
    assert (letter.source_topic, letter.source_partition, letter.source_offset) == (tier, 0, 0)
    assert f"{tier}[0] at offset 0" in letter.message
    assert worker.alive(), "the worker stopped"
    assert kit.recording.run_counts()[big.id] == 0


def test_a_tier_job_due_in_an_hour_goes_to_the_deferred_topic_and_the_tier_moves_on(
    kit: WorkerKit,
) -> None:
    far = _noop(1, not_before=int(time.time() * 1000) + 3_600_000)
    behind = _noop(2)
    far_value, _ = _on_tier(kit, far, behind)
    worker = kit.workers.start("--concurrency", "4", env=ENV)

    assert wait_for(lambda: kit.recording.all_finished([behind.id]), 60), worker.log_tail()
    with _Reader(kit.settings, timeout=30) as reader:
        deferred = reader.read(kit.topics.deferred)[kit.topics.deferred]
    assert [(m.value(), m.key()) for m in deferred] == [(far_value, b"key")]
    assert kit.recording.run_counts()[far.id] == 0
    assert worker.alive(), "the worker stopped"


def test_the_jobs_of_a_tier_removed_from_the_settings_still_come_back(kit: WorkerKit) -> None:
    # The namespace had a third tier; the workers' settings no longer name it.
    apply_topics(
        with_retry_tiers(
            kit.settings.bootstrap_servers, kit.settings.namespace, [*RETRY_DELAYS, 5.0]
        )
    )
    far = _noop(1, not_before=int(time.time() * 1000) + 3_600_000)
    due = _noop(2)
    far_value, _ = _on_tier(kit, far, due, tier=2)
    worker = kit.workers.start("--concurrency", "4", env=ENV)

    assert wait_for(lambda: kit.recording.all_finished([due.id]), 60), worker.log_tail()
    # The one due in an hour waits in <ns>.deferred, as one a known tier could not hold.
    with _Reader(kit.settings, timeout=30) as reader:
        deferred = reader.read(kit.topics.deferred)[kit.topics.deferred]
    assert [(m.value(), m.key()) for m in deferred] == [(far_value, b"key")]
    assert f"retry tiers {kit.topics.retry(2)} are not in topics.retry_delays_s" in worker.log()
    assert worker.alive(), "the worker stopped"


def test_jobs_left_on_a_tier_come_back_to_workers_whose_settings_name_no_tier(
    kit: WorkerKit,
) -> None:
    # The namespace had tiers 0 and 1; the workers' settings now name none (every retry goes
    # through <ns>.deferred), and their relay did not start: the jobs there waited for ever.
    due = _noop(1)
    _on_tier(kit, due, tier=1)
    worker = kit.workers.start("--concurrency", "4", env={"PIPELINE_TOPICS__RETRY_DELAYS_S": "[]"})

    assert wait_for(lambda: kit.recording.all_finished([due.id]), 60), worker.log_tail()
    left = f"{kit.topics.retry(0)}, {kit.topics.retry(1)}"
    assert f"retry tiers {left} are not in topics.retry_delays_s" in worker.log()
