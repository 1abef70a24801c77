"""Long scheduler runs (``make chaos``): leaders SIGKILLed again and again, jobs through tiers."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import Pipeline
from pipeline._admin import apply_topics
from pipeline._schedule import make_schedule
from pipeline._scheduletable import publish_schedules
from pipeline._settings import Settings
from tests.integration.scheduler.conftest import (
    SchedulerFactory,
    collect,
    job_consumer,
    scheduler_env,
)


@pytest.fixture
def schedulers(settings: Settings, tmp_path: Path) -> Iterator[SchedulerFactory]:
    apply_topics(settings)
    factory = SchedulerFactory(settings, tmp_path)
    try:
        yield factory
    finally:
        for process in factory.started:
            process.kill()


def test_repeated_leader_kills_release_every_job_once(schedulers: SchedulerFactory) -> None:
    """20,000 jobs over 60 s through memory and tiers; the leader is killed every ~10 s."""
    settings = schedulers.settings
    env = scheduler_env(horizon_s=4, wait_tiers_s=[2, 8, 20])
    publish_schedules(
        settings, [make_schedule("tick", cron="* * * * * *", job_type="tick", missed="all")]
    )
    rng = random.Random(3)
    app = Pipeline(settings)
    ids = {app.enqueue("delayed", {"i": i}, delay=rng.uniform(1, 60)) for i in range(20_000)}
    app.flush()
    consumer = job_consumer(settings)
    processes = [schedulers.start(env) for _ in range(3)]
    seen = []
    try:
        for _ in range(5):
            seen += collect(consumer, 10**9, timeout=10)
            leaders = [
                p for p in processes if p.process.poll() is None and " leading " in p.output()
            ]
            for leader in leaders[-1:]:
                leader.kill()
            processes = [p for p in processes if p.process.poll() is None]
            processes.append(schedulers.start(env))
        delayed = {r.job.id for r in seen if r.job.type == "delayed"}
        seen += collect(consumer, len(ids - delayed), timeout=60)
        seen += collect(consumer, 10**9, timeout=3)
    finally:
        consumer.close()
    counts = Counter(r.job.id for r in seen if r.job.type == "delayed")
    assert set(counts) == ids
    assert max(counts.values()) == 1
    # Released up to release_lead_ms early (the worker holds each job until its not_before).
    lead = settings.scheduler.release_lead_ms
    assert all(r.timestamp_ms >= (r.job.not_before or 0) - lead for r in seen)
    ticks = Counter(r.job.not_before for r in seen if r.job.type == "tick")
    assert max(ticks.values()) == 1
    fires = sorted(t for t in ticks if t is not None)
    assert [t for t in range(fires[0], fires[-1], 1000) if t not in ticks] == []
