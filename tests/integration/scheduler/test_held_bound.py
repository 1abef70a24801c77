"""A leader that held as many jobs of a partition as a progress record may name hands over
exactly: its records read back, so the next leader releases none of its releases again.

Both leaders run in this process with a bound of 50 (the default is two million), written and
read back alike; every job is written to one partition of ``<ns>.deferred``. A record also
fits in one message of the leader's producer, however its held jobs fall due: with the
smallest ``message.max.bytes`` librdkafka allows, jobs released out of offset order split the
held offsets into many runs, and every transaction still commits.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from pipeline import JobCodec, Pipeline
from pipeline._settings import Settings
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._session import LeaderSession

from .conftest import job_consumer

BOUND = 50


def count(session: LeaderSession, metric: str) -> float:
    return session.metrics.registry.get_sample_value(metric) or 0.0


def released_by_the_next_leader(
    second: LeaderSession, enough: Callable[[Counter[str]], bool]
) -> Counter[str]:
    """How often ``second``, taking over, released each job, once ``enough`` were (30 s at
    most); it reads every record of the previous leader back, skipping none."""
    consumer = job_consumer(second.settings)
    released: Counter[str] = Counter()
    codec = JobCodec()
    try:
        second.start()
        assert count(second, "pipeline_scheduler_state_records_skipped_total") == 0
        deadline = time.monotonic() + 30
        while not enough(released) and time.monotonic() < deadline:
            second.step()
            for message in consumer.consume(1000, 0):
                if message.error() is None:
                    released[codec.decode(message.value() or b"").id] += 1
    finally:
        second.close()
        consumer.close()
    return released


def test_a_leader_at_the_bound_hands_over_without_releasing_a_job_twice(
    topics: Settings,
) -> None:
    settings = topics
    first = LeaderSession(settings, SchedulerMetrics(), [], max_held=BOUND)
    first.start()
    app = Pipeline(settings)
    start = time.time()

    def at(seconds: float) -> datetime:
        return datetime.fromtimestamp(start + seconds, UTC)

    # The first job is due last: the watermark stays at it while the leader releases the jobs
    # behind it, whose release only the progress record tells the next leader about.
    last = app.enqueue("held.job", {"i": 0}, key="one", run_at=at(3.0))
    ids = {last}
    ids.update(
        app.enqueue("held.job", {"i": i}, key="one", run_at=at(0.5 + i * 0.008))
        for i in range(1, 200)
    )
    app.flush()
    most = 0
    try:
        while count(first, "pipeline_scheduler_releases_total") < 30:
            first.step()
            most = max(most, *(p.held_count for p in first.progress.values()))
    finally:
        first.close()
    assert most == BOUND  # it held as many as a record may name, never more
    second = LeaderSession(settings, SchedulerMetrics(), [], max_held=BOUND)
    released = released_by_the_next_leader(second, lambda seen: last in seen)
    # The last job is the last one written to the jobs' partition: everything is read.
    assert set(released) == ids
    assert [job for job, n in released.items() if n > 1] == []


def test_a_leader_whose_held_jobs_fall_due_out_of_order_writes_records_that_fit(
    topics: Settings,
) -> None:
    # About 450 bytes of record: a burst of 800 held, 300 of it released first (every other
    # offset), would take 1,200.
    settings = topics.model_copy(update={"kafka": {**topics.kafka, "message.max.bytes": "1000"}})
    first = LeaderSession(settings, SchedulerMetrics(), [])
    first.start()
    app = Pipeline(topics)
    start = time.time()

    def at(seconds: float) -> datetime:
        return datetime.fromtimestamp(start + seconds, UTC)

    ids = [
        app.enqueue("held.job", {"i": i}, key="one", run_at=at(1.0 + (i % 2) * 1.5 + i * 0.001))
        for i in range(800)
    ]
    app.flush()
    paused = False
    try:  # a transaction the producer refused would raise here
        while count(first, "pipeline_scheduler_releases_total") < 300:
            first.step()
            paused = paused or bool(first._paused)
    finally:
        first.close()
    assert paused  # it held as many as a record may name in its worst release order
    second = LeaderSession(settings, SchedulerMetrics(), [])
    released = released_by_the_next_leader(second, lambda seen: len(seen) >= len(ids))
    assert set(released) == set(ids)
    assert [job for job, n in released.items() if n > 1] == []
