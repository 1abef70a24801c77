"""A running scheduler and a per-second schedule with ``missed="all"``: paused, it does not
fire; resumed, it fires again, and none of the fires of its paused time are run."""

from __future__ import annotations

from pipeline._job import now_ms
from pipeline._schedule import make_schedule
from pipeline._scheduleops import pause_schedule, resume_schedule
from pipeline._scheduletable import publish_schedules

from .conftest import Released, SchedulerFactory, collect, job_consumer

EVERY_SECOND = "* * * * * *"


def fire_times(released: list[Released]) -> list[int]:
    return sorted(r.job.not_before or 0 for r in released)


def test_paused_fires_are_never_run_even_with_missed_all(schedulers: SchedulerFactory) -> None:
    settings = schedulers.settings
    publish_schedules(
        settings, [make_schedule("tick", cron=EVERY_SECOND, job_type="t", missed="all")]
    )
    consumer = job_consumer(settings)
    try:
        scheduler = schedulers.start()
        before = collect(consumer, 1, timeout=30)
        assert before, scheduler.output()[-2000:]
        assert pause_schedule(settings, "tick")
        assert not pause_schedule(settings, "tick")  # idempotent: nothing written
        paused_ms = now_ms()
        # The leader follows <ns>.schedules live: at most the fire in flight at the pause.
        during = collect(consumer, 10**9, timeout=3)
        resumed_ms = now_ms()
        assert resume_schedule(settings, "tick")
        assert not resume_schedule(settings, "tick")
        after = collect(consumer, 3, timeout=15)
    finally:
        consumer.close()
    assert [t for t in fire_times(during) if t > paused_ms + 1000] == [], fire_times(during)
    fired = fire_times(after)
    assert len(fired) == 3, scheduler.output()[-2000:]
    # It fires again, and only for times after its resume: no catch-up of the paused time.
    assert all(t > resumed_ms for t in fired), (resumed_ms, fired)
