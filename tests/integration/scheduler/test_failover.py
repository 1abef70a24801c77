"""One leader, hot standbys: a SIGKILLed leader's work is finished by a standby, exactly once."""

from __future__ import annotations

import random
import time
from collections import Counter

from pipeline import Pipeline
from pipeline._schedule import fire_job_id, make_schedule, publish_schedules

from .conftest import SchedulerFactory, collect, job_consumer


def test_standby_takes_over_a_killed_leader_without_loss_or_duplicates(
    schedulers: SchedulerFactory,
) -> None:
    settings = schedulers.settings
    publish_schedules(
        settings,
        [make_schedule("every-second", cron="* * * * * *", job_type="tick", missed="all")],
    )
    rng = random.Random(11)
    app = Pipeline(settings)
    ids = {app.enqueue("delayed.job", {"i": i}, delay=rng.uniform(2, 16)) for i in range(5_000)}
    app.flush()
    consumer = job_consumer(settings)
    leader = schedulers.start()
    schedulers.wait_leading(leader)
    standby = schedulers.start()
    try:
        before = collect(consumer, 10**9, timeout=4)  # the leader releases and fires a while
        killed_ms = time.time_ns() // 1_000_000
        leader.kill()
        schedulers.wait_leading(standby, timeout=30)
        took_over_ms = time.time_ns() // 1_000_000
        released_ids = {r.job.id for r in before if r.job.type == "delayed.job"}
        remaining = len(ids - released_ids)
        after = collect(consumer, remaining + 10**6, timeout=25)
        stop_ms = time.time_ns() // 1_000_000
    finally:
        consumer.close()
    everything = before + after
    delayed = Counter(r.job.id for r in everything if r.job.type == "delayed.job")
    assert set(delayed) == ids, standby.output()[-3000:]
    assert max(delayed.values()) == 1
    lead = settings.scheduler.release_lead_ms  # released that early at most; workers hold them
    assert all(r.timestamp_ms >= (r.job.not_before or 0) - lead for r in everything)
    assert took_over_ms - killed_ms < 6000 + 8000
    ticks = Counter(r.job.not_before for r in everything if r.job.type == "tick")
    assert max(ticks.values()) == 1, [t for t, n in ticks.items() if n > 1]
    for r in everything:
        if r.job.type == "tick":
            assert r.job.id == fire_job_id(
                settings.namespace, "every-second", r.job.not_before or 0
            )
    # Every second from the first fire to shortly before the end was fired once, the
    # seconds the leader was dead included.
    fires = sorted(t for t in ticks if t is not None)
    window = range(fires[0], stop_ms - 2000, 1000)
    missing = [t for t in window if t not in ticks]
    assert not missing, (missing, killed_ms, took_over_ms)
    assert any(killed_ms <= t <= took_over_ms for t in fires)
