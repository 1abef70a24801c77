"""Delayed jobs are released once, never early, with their ids, through memory and wait tiers."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from pipeline import Job, JobCodec, Pipeline
from pipeline._job import new_job_id, now_ms
from pipeline._topics import TopicNames

from .conftest import SchedulerFactory, collect, job_consumer, scheduler_env


@pytest.mark.slow
def test_ten_thousand_jobs_are_released_once_and_never_before_their_lead(
    schedulers: SchedulerFactory,
) -> None:
    settings = schedulers.settings
    rng = random.Random(5)
    delays = [rng.uniform(1, 20) for _ in range(10_000)]
    app = Pipeline(settings)
    ids = {app.enqueue("delayed.job", {"i": i}, delay=d) for i, d in enumerate(delays)}
    app.flush()
    consumer = job_consumer(settings)
    scheduler = schedulers.start()
    try:
        released = collect(consumer, 10_000, timeout=60)
        extra = collect(consumer, 1, timeout=2)  # nothing more may come
    finally:
        consumer.close()
    counts = Counter(r.job.id for r in released + extra)
    assert set(counts) == ids, scheduler.output()[-3000:]
    assert max(counts.values()) == 1
    # Released up to release_lead_ms early (the worker holds each job until its not_before).
    lead = settings.scheduler.release_lead_ms
    for r in released:
        assert r.job.not_before is not None
        earliest = r.job.not_before - lead
        assert r.timestamp_ms >= earliest, (r.job.id, r.timestamp_ms, r.job.not_before)
        assert r.received_ms >= earliest
        assert r.topic == settings.namespace + ".jobs.default"


@pytest.mark.slow
def test_far_jobs_travel_through_wait_tiers_and_are_released_on_time(
    schedulers: SchedulerFactory,
) -> None:
    """A shortened clock: 2 s horizon, tiers of 1, 3 and 6 s; delays up to 25 s."""
    settings = schedulers.settings
    rng = random.Random(7)
    delays = [rng.uniform(0.5, 25) for _ in range(2_000)]
    app = Pipeline(settings)
    ids = {app.enqueue("far.job", {"i": i}, delay=d) for i, d in enumerate(delays)}
    app.flush()
    consumer = job_consumer(settings)
    scheduler = schedulers.start(scheduler_env(horizon_s=2, wait_tiers_s=[1, 3, 6]))
    schedulers.wait_leading(scheduler)
    leading_ms = time.time_ns() // 1_000_000
    try:
        released = collect(consumer, 2_000, timeout=60)
        extra = collect(consumer, 1, timeout=2)
    finally:
        consumer.close()
    counts = Counter(r.job.id for r in released + extra)
    assert set(counts) == ids, scheduler.output()[-3000:]
    assert max(counts.values()) == 1
    lead = settings.scheduler.release_lead_ms
    assert all(r.timestamp_ms >= (r.job.not_before or 0) - lead for r in released)
    # Jobs due well after the start waited in tiers then in memory: released within ms.
    late = sorted(
        r.timestamp_ms - (r.job.not_before or 0)
        for r in released
        if (r.job.not_before or 0) > leading_ms + 8000
    )
    assert len(late) > 1000
    assert late[len(late) // 2] < 250, late
    assert late[int(len(late) * 0.99)] < 1000, late[-20:]


def test_a_partition_added_to_the_deferred_topic_is_read_by_the_leader(
    schedulers: SchedulerFactory,
) -> None:
    """A leader assigns itself the partitions there are when its term begins; one added later
    (`pipeline topics apply` with more partitions) is read once the leader has seen it."""
    settings = schedulers.settings
    scheduler = schedulers.start(scheduler_env(partitions_check_s=0.5))
    schedulers.wait_leading(scheduler)
    deferred = TopicNames(settings.namespace).deferred
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    before = len(admin.list_topics(deferred, timeout=10).topics[deferred].partitions)
    admin.create_partitions([NewPartitions(deferred, before + 1)])[deferred].result(30)
    # A delayed job written straight to the new partition, as a producer's partitioner may.
    job = Job(id=new_job_id(), type="t", payload=b"{}", not_before=now_ms() + 1000)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(deferred, JobCodec().encode(job), partition=before)
    assert producer.flush(30) == 0
    consumer = job_consumer(settings)
    try:
        released = collect(consumer, 1, timeout=60)
    finally:
        consumer.close()
    assert [r.job.id for r in released] == [job.id], scheduler.output()[-3000:]
    assert "starting a new term" in scheduler.output()
