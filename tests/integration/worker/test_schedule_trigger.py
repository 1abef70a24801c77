"""``trigger_schedule`` with a worker running: one run per ``at_ms``, however often called."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline._job import now_ms
from pipeline._schedule import fire_job_id, make_schedule
from pipeline._scheduleops import pause_schedule, trigger_schedule
from pipeline._scheduletable import publish_schedules
from tests.waiting import wait_for

from .harness import wait_joined

if TYPE_CHECKING:
    from .fixtures import WorkerKit


def test_a_trigger_runs_once_per_at_ms_also_when_paused(kit: WorkerKit) -> None:
    settings = kit.settings
    # Fires once a year: only the triggers enqueue anything here (and no scheduler runs).
    schedule = make_schedule(
        "report", cron="0 0 1 1 *", job_type="long", payload={"n": 1, "seconds": 1.0}
    )
    publish_schedules(settings, [schedule])
    worker = kit.workers.start("--concurrency", "4")
    wait_joined(settings, kit.offsets.group, [worker], stable=False)
    at = now_ms()
    first = trigger_schedule(settings, "report", at_ms=at)
    # Submitted twice: read while the first still runs (a one-second job), it is dropped.
    second = trigger_schedule(settings, "report", at_ms=at)
    assert second.idempotency_key == first.idempotency_key == f"manual:report:{at}"
    assert first.id != fire_job_id(settings.namespace, "report", at)
    assert first.headers["pipeline-trigger"] == "manual"
    assert pause_schedule(settings, "report")
    later = trigger_schedule(settings, "report", at_ms=at + 1)  # paused: triggers still run
    assert wait_for(lambda: kit.recording.all_finished([first.id, later.id]), 30), worker.log_tail()
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=30)
    runs = kit.recording.run_counts()
    assert (runs[first.id], runs[second.id], runs[later.id]) == (1, 0, 1)
    assert kit.recording.count("S", "long") == 2
