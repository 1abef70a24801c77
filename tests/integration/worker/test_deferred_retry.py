"""A retry due later than twice the largest retry tier waits on ``<ns>.deferred``.

With retry tiers of 0.2 s and 0.5 s, a ``later`` job that raises ``Retry(after=3)`` on its first
attempt is moved to ``<ns>.deferred`` (3 s > 2 x 0.5 s), not to a tier; a running
``pipeline-scheduler`` releases it to the job's own priority topic, where it runs as attempt 2
at the time it asked for, not before.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from pipeline import Job, JobCodec, Priority, Settings
from pipeline._deadletters import _Reader

from ..scheduler.conftest import SchedulerFactory
from .fixtures import with_retry_tiers
from .harness import enqueue, wait_until
from .harness.metrics import free_port, scrape, total

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

RETRY_DELAYS = [0.2, 0.5]
ENV = {"PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS)}
AFTER_S = 3.0
LATE_S = 2.0
"""How much later than asked the retry may start: the worker's move transaction (about once a
second), the scheduler's read of ``<ns>.deferred`` and its release transaction."""


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return with_retry_tiers(bootstrap_servers, namespace, RETRY_DELAYS)


def test_a_retry_beyond_the_tiers_is_released_by_the_scheduler_on_time(
    kit: WorkerKit, schedulers: SchedulerFactory
) -> None:
    scheduler_port, worker_port = free_port(), free_port()
    scheduler = schedulers.start({**ENV, "PIPELINE_SCHEDULER__METRICS_PORT": str(scheduler_port)})
    # Leading before the job fails: the release must not wait for a leader.
    schedulers.wait_leading(scheduler)
    worker = kit.workers.start("--concurrency", "4", "--metrics-port", str(worker_port), env=ENV)
    [job_id] = enqueue(
        kit.producer, "later", 1, fields={"after": AFTER_S}, priority="high", max_attempts=3
    )
    wait_until(
        lambda: kit.recording.all_finished([job_id]),
        timeout=60,
        what=lambda: f"the retried job to succeed\n{scheduler.output()[-3000:]}",
        watch=[worker],
    )

    runs = [e for e in kit.recording.events if e.job_id == job_id]
    assert [e.kind for e in runs] == ["S", "F", "S", "E"]
    high = kit.topics.jobs(Priority.HIGH)
    assert [e.topic for e in runs] == [high] * 4

    [deferred] = _jobs_on(kit.settings, kit.topics.deferred)
    assert (deferred.id, deferred.attempt, deferred.priority) == (job_id, 2, Priority.HIGH)
    assert [(e.attempt, e.retryable) for e in deferred.errors] == [(1, True)]
    assert deferred.not_before is not None
    failed_ms = runs[1].time_ns // 1_000_000
    # not_before is the failure time + 3 s, the failure time read (in ms) just after the F line.
    assert 0 <= deferred.not_before - (failed_ms + AFTER_S * 1000) < 500
    # Unkeyed, so each copy may be on any partition of the topic.
    on_high = sorted(
        (job.attempt, job.not_before) for job in _jobs_on(kit.settings, high) if job.id == job_id
    )
    assert on_high == [
        (1, None),
        (2, deferred.not_before),
    ]
    retry_tiers = [kit.topics.retry(tier) for tier in range(len(RETRY_DELAYS))]
    assert sum(kit.offsets.ends(retry_tiers).values()) == 0, "a retry went through a tier"

    started_ms = runs[2].time_ns / 1e6
    late_s = (started_ms - deferred.not_before) / 1000
    assert late_s >= 0, f"attempt 2 started {-late_s:.3f}s before its not_before"
    assert late_s <= LATE_S, f"attempt 2 started {late_s:.3f}s after its not_before"

    worker_samples = scrape(worker_port) or {}
    # Every registered type's counters exist from the start, at 0: the retries are the others.
    retried = {
        k: v for k, v in worker_samples.items() if k.startswith("pipeline_jobs_retried") and v
    }
    assert retried == {'pipeline_jobs_retried_total{route="deferred",type="later"}': 1}
    assert total(worker_samples, "pipeline_retries_released_total") == 0
    scheduler_samples = scrape(scheduler_port) or {}
    assert total(scheduler_samples, "pipeline_scheduler_releases_total") == 1, scheduler_samples


def _jobs_on(settings: Settings, topic: str) -> list[Job]:
    """Every committed job on ``topic`` (in log order within each partition)."""
    with _Reader(settings, timeout=30) as reader:
        messages = reader.read(topic)[topic]
    codec = JobCodec()
    return [codec.decode(m.value() or b"") for m in messages]
