"""One leader, hot standbys: a SIGKILLed leader's work is finished by a standby, exactly once."""

from __future__ import annotations

import random
import time
from collections import Counter
from datetime import UTC, datetime

import pytest

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined, unused-ignore]

from pipeline import Pipeline
from pipeline._schedule import fire_job_id, make_schedule
from pipeline._scheduletable import publish_schedules
from pipeline._settings import Settings
from pipeline._topics import scheduler_group
from tests.waiting import wait_for

from .conftest import Released, SchedulerFactory, collect, job_consumer, scheduler_env


def _members(settings: Settings) -> int:
    """Members of the leadership group now."""
    admin = AdminClient(dict(settings.client_config()))
    group = scheduler_group(settings)
    future = admin.describe_consumer_groups([group], request_timeout=10)[group]
    return len(future.result(timeout=15).members)


@pytest.mark.slow
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
    # One fire a step: the seconds late at the takeover (within grace) take the standby
    # several steps, each going on from the last (the cap dropped all but the newest).
    env = scheduler_env(max_catchup_fires=1)
    leader = schedulers.start(env)
    schedulers.wait_leading(leader)
    standby = schedulers.start(env)
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
    assert took_over_ms - killed_ms < settings.scheduler.session_timeout_ms + 8000
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


def test_a_standby_takes_over_with_the_default_short_session(
    schedulers: SchedulerFactory,
) -> None:
    """The default session timeout (1.5 s) is one the brokers allow: nobody falls back to theirs.

    How soon the standby releases is a speed figure, measured by ``make bench-failover``
    (docs/benchmarks.md), not asserted here: a loaded machine moves it.
    """
    settings = schedulers.settings  # the default session timeout: nothing overridden
    app = Pipeline(settings)
    first_due = time.time() + 3
    for i in range(1200):  # one job due every 100 ms for two minutes
        due = datetime.fromtimestamp(first_due + i / 10, UTC)
        app.enqueue("delayed.job", {"i": i}, run_at=due)
    app.flush()
    consumer = job_consumer(settings)
    leader = schedulers.start()
    schedulers.wait_leading(leader)
    standby = schedulers.start()
    released: list[Released] = []
    try:
        assert wait_for(lambda: _members(settings) == 2, timeout=30, interval=0.2), standby.output()
        assert collect(consumer, 5, timeout=30), leader.output()  # the leader releases
        killed_ms = time.time_ns() // 1_000_000
        leader.kill()
        # A job due later than this was released after the kill: by the standby.
        only_standby = killed_ms + settings.scheduler.release_lead_ms

        def standby_released() -> bool:
            released.extend(collect(consumer, 10**6, timeout=0.2))
            return any((r.job.not_before or 0) > only_standby for r in released)

        assert wait_for(standby_released, timeout=30), standby.output()[-3000:]
    finally:
        consumer.close()
    first = min(r.timestamp_ms for r in released if (r.job.not_before or 0) > only_standby)
    assert first >= killed_ms
    for scheduler in (leader, standby):
        assert "the brokers refuse scheduler.session_timeout_ms" not in scheduler.output()
