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

from pipeline import Job, JobCodec, Priority
from pipeline._deadletters import _Reader
from tests.waiting import wait_for

from .harness import enqueue

if TYPE_CHECKING:
    from ..scheduler.conftest import SchedulerFactory
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


def test_delayed_jobs_never_start_before_the_due_time_asked_for(
    kit: WorkerKit, schedulers: SchedulerFactory
) -> None:
    scheduler = schedulers.start()
    schedulers.wait_leading(scheduler)
    worker = kit.workers.start("--concurrency", "32")
    rng = random.Random(6)
    # The due time as a caller computes it: a float of seconds, taken before the call.
    due: dict[str, float] = {}
    for n in range(600):
        delay = rng.uniform(2.0, 4.0)
        asked = time.time() + delay
        due[kit.producer.enqueue("noop", {"n": n}, delay=delay)] = asked
    kit.producer.flush(60)
    assert wait_for(lambda: kit.recording.all_finished(due), 90), worker.log_tail()

    starts = {e.job_id: e.time_ns / 1e9 for e in kit.recording.starts("noop") if e.job_id in due}
    early = {i: round((due[i] - s) * 1000, 3) for i, s in starts.items() if s < due[i]}
    assert early == {}, "delayed jobs started before their due time (ms early)"


def test_a_job_written_to_a_priority_topic_long_before_it_is_due_waits_for_it(
    kit: WorkerKit, schedulers: SchedulerFactory
) -> None:
    scheduler = schedulers.start()
    schedulers.wait_leading(scheduler)
    worker = kit.workers.start("--concurrency", "8")
    # Once a first job ran, the worker is fetching every partition: lateness is the hold's.
    warm_up = enqueue(kit.producer, "noop", 12, first=-100)
    assert wait_for(lambda: kit.recording.all_finished(warm_up), 60), worker.log_tail()
    topic = kit.topics.jobs(Priority.DEFAULT)
    # A producer in another language: the envelope's bytes, straight to a priority topic.
    producer = Producer(kit.settings.client_config())
    codec = JobCodec()
    due: dict[str, int] = {}
    near: list[str] = []
    # Three past the worker's hold window (HOLD_MAX_MS, 5 s), two within it.
    for n, ahead_ms in enumerate([6500, 7000, 7500, 1000, 2500]):
        not_before = time.time_ns() // 1_000_000 + ahead_ms
        job = Job(id=uuid.uuid4().hex, type="noop", payload=b'{"n": %d}' % n, not_before=not_before)
        due[job.id] = not_before
        if ahead_ms <= 5000:
            near.append(job.id)
        producer.produce(topic, codec.encode(job))
    assert producer.flush(30) == 0
    assert wait_for(lambda: kit.recording.all_finished(due), 60), worker.log_tail()

    starts = {e.job_id: e.time_ns / 1e6 for e in kit.recording.starts("noop") if e.job_id in due}
    assert set(starts) == set(due)  # each once
    early = {i: due[i] - ms for i, ms in starts.items() if ms < due[i]}
    assert early == {}, "jobs started before their not_before"
    # Far ahead: through the deferred topic and the scheduler, once each.
    assert worker.log().count("moved to the deferred topic") >= 1
    assert len([e for e in kit.recording.starts("noop") if e.job_id in due]) == len(due)
    # Within the hold window: held by the worker, started on time as before.
    assert all(starts[i] - due[i] < 500 for i in near), {i: starts[i] - due[i] for i in near}


def test_a_job_deferred_by_the_worker_keeps_its_message_s_headers_to_its_run(
    kit: WorkerKit, schedulers: SchedulerFactory
) -> None:
    """The worker's move to ``<ns>.deferred`` wrote the job without its Kafka headers (a
    ``traceparent`` another producer set, say), so the scheduler released it without them."""
    scheduler = schedulers.start()
    worker = kit.workers.start("--concurrency", "4")
    warm_up = enqueue(kit.producer, "noop", 3, first=-100)  # the worker is fetching now
    assert wait_for(lambda: kit.recording.all_finished(warm_up), 60), worker.log_tail()
    schedulers.wait_leading(scheduler)
    topic = kit.topics.jobs(Priority.DEFAULT)
    codec = JobCodec()
    headers: list[tuple[str, str | bytes | None]] = [
        ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    ]
    not_before = time.time_ns() // 1_000_000 + 6000  # past the worker's hold window (5 s)
    job = Job(id=uuid.uuid4().hex, type="noop", payload=b'{"n": 0}', not_before=not_before)
    producer = Producer(kit.settings.client_config())
    producer.produce(topic, codec.encode(job), b"k", headers=headers)
    assert producer.flush(30) == 0
    assert wait_for(lambda: kit.recording.all_finished([job.id]), 60), worker.log_tail()

    assert "moved to the deferred topic" in worker.log()
    with _Reader(kit.settings, timeout=30) as reader:
        read = reader.read(kit.topics.deferred, topic)
    # Written by the producer, moved by the worker, released by the scheduler: each with them.
    journey = [
        (m.topic(), m.key(), m.headers())
        for m in (*read[topic], *read[kit.topics.deferred])
        if codec.decode(m.value() or b"").id == job.id
    ]
    assert journey == [(topic, b"k", headers)] * 2 + [(kit.topics.deferred, b"k", headers)]
