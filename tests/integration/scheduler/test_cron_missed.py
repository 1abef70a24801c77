"""Scheduler down across three fires of a 10-second schedule: skip, once and all as named."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from pipeline._schedule import fires_between, make_schedule
from pipeline._scheduletable import publish_schedules

from .conftest import Released, SchedulerFactory, collect, job_consumer, scheduler_env

EVERY_10S = "* * * * * */10"


def by_schedule(released: list[Released]) -> dict[str, list[int]]:
    fires: dict[str, list[int]] = defaultdict(list)
    for r in released:
        fires[r.job.headers["pipeline-schedule"]].append(r.job.not_before or 0)
    return {name: sorted(times) for name, times in fires.items()}


@pytest.mark.slow
def test_missed_fire_policies(schedulers: SchedulerFactory) -> None:
    settings = schedulers.settings
    publish_schedules(
        settings,
        [
            make_schedule(policy, cron=EVERY_10S, job_type=f"cron.{policy}", missed=policy)
            for policy in ("skip", "once", "all")
        ],
    )
    env = scheduler_env(misfire_grace_s=1)
    consumer = job_consumer(settings)
    try:
        first = schedulers.start(env)
        # Run until every schedule fired once, so each has a last fire on record.
        before: list[Released] = []
        deadline = time.monotonic() + 25
        while len(by_schedule(before)) < 3 and time.monotonic() < deadline:
            before += collect(consumer, 1, timeout=1)
        assert len(by_schedule(before)) == 3, first.output()[-2000:]
        assert first.terminate() == 0  # graceful: the last transaction is committed
        stopped_ms = time.time_ns() // 1_000_000
        # Down for 30 s: nothing is enqueued meanwhile.
        during = collect(consumer, 10**9, timeout=30)
        assert during == []
        second = schedulers.start(env)
        schedulers.wait_leading(second)
        restarted_ms = time.time_ns() // 1_000_000
        after = collect(consumer, 10**9, timeout=12)
    finally:
        consumer.close()
    last_before = {name: times[-1] for name, times in by_schedule(before).items()}
    fired = by_schedule(after)
    for name, last in last_before.items():
        missed = fires_between(
            EVERY_10S, "UTC", max(last, stopped_ms - 10_000), restarted_ms - 1000, 100
        )
        missed = [t for t in missed if t > last]
        assert len(missed) >= 2, (name, missed)
        caught_up = [t for t in fired.get(name, []) if t <= missed[-1]]
        if name == "skip":
            assert caught_up == [], (name, fired)
        elif name == "once":
            assert caught_up == [missed[-1]], (name, missed, fired)
        else:
            assert caught_up == missed, (name, missed, fired)
        # ... and each goes on firing on schedule.
        assert any(t > restarted_ms - 1000 for t in fired.get(name, [])), (name, fired)
