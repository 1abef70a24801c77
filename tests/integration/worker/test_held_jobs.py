"""A job that reaches a priority topic shortly before its ``not_before`` starts on its time.

The scheduler releases delayed jobs ``scheduler.release_lead_ms`` early, so that the release
transaction has committed when they are due; the worker holds each until its millisecond.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer

from pipeline import Job, Priority
from tests.waiting import wait_for

from .harness import enqueue

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_jobs_released_early_start_at_their_not_before_and_not_before(kit: WorkerKit) -> None:
    worker = kit.workers.start("--concurrency", "16")
    # Once a first job ran, the worker is fetching every partition: lateness is the hold's.
    warm_up = enqueue(kit.producer, "noop", 12, first=-100)
    assert wait_for(lambda: kit.recording.all_finished(warm_up), 60), worker.log_tail()
    topic = kit.topics.jobs(Priority.DEFAULT)
    producer = Producer(kit.settings.client_config())
    rng = random.Random(11)
    due: dict[str, int] = {}
    for _ in range(200):
        not_before = time.time_ns() // 1_000_000 + rng.randint(50, 1500)
        job = Job(id=uuid.uuid4().hex, type="noop", payload=b'{"n": 0}', not_before=not_before)
        due[job.id] = not_before
        producer.produce(topic, kit.producer.codec.encode(job))
    assert producer.flush(30) == 0
    assert wait_for(lambda: kit.recording.all_finished(due), 60), worker.log_tail()

    starts = {e.job_id: e.time_ns / 1e6 for e in kit.recording.starts("noop") if e.job_id in due}
    early = {i: due[i] - ms for i, ms in starts.items() if ms < due[i]}
    assert early == {}, "held jobs started before their not_before"
    late = sorted(ms - due[i] for i, ms in starts.items())
    assert late[len(late) // 2] < 50, f"held jobs should start on time, median late {late}"
