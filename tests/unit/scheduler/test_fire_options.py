"""A cron fire takes the schedule's options, else the job type's declared ones, else defaults."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import Pipeline, Priority
from pipeline._avro import SchemaStore
from pipeline._codec import ScheduleCodec
from pipeline._records import Schedule
from pipeline._registry import JobOptions
from pipeline._schedule import fire_job, make_schedule
from pipeline._settings import Settings

FIRE = 1_700_000_000_000
DECLARED = JobOptions(priority=Priority.HIGH, max_attempts=2)
SCHEMAS = Path(__file__).resolve().parents[3] / "schemas"


def test_a_schedule_naming_no_options_takes_the_declared_ones() -> None:
    schedule = make_schedule("n", cron="0 3 * * *", job_type="t")
    assert schedule.priority is None
    assert schedule.max_attempts is None
    job = fire_job(schedule, "ns", FIRE, 5, DECLARED)
    assert (job.priority, job.max_attempts) == (Priority.HIGH, 2)


def test_options_the_schedule_names_win() -> None:
    schedule = make_schedule("n", cron="0 3 * * *", job_type="t", priority="low", max_attempts=4)
    job = fire_job(schedule, "ns", FIRE, 5, DECLARED)
    assert (job.priority, job.max_attempts) == (Priority.LOW, 4)
    explicit_default = make_schedule("n", cron="0 3 * * *", job_type="t", priority="default")
    assert fire_job(explicit_default, "ns", FIRE, 5, DECLARED).priority == Priority.DEFAULT


def test_without_declared_options_the_defaults_apply() -> None:
    schedule = make_schedule("n", cron="0 3 * * *", job_type="t")
    job = fire_job(schedule, "ns", FIRE, 5)
    assert (job.priority, job.max_attempts) == (Priority.DEFAULT, 5)
    priority_only = JobOptions(priority=Priority.CRITICAL)
    job = fire_job(schedule, "ns", FIRE, 5, priority_only)
    assert (job.priority, job.max_attempts) == (Priority.CRITICAL, 5)


def test_app_schedule_leaves_the_options_to_the_type() -> None:
    app = Pipeline(Settings(namespace="unit"))

    @app.job("t", priority="high", max_attempts=2)
    def handler() -> None: ...

    made = app.schedule("n", cron="0 3 * * *", job_type="t")
    assert (made.priority, made.max_attempts) == (None, None)
    found = app.registry.find("t")
    assert found is not None
    job = fire_job(made, "ns", FIRE, 5, found.options)
    assert (job.priority, job.max_attempts) == (Priority.HIGH, 2)


def test_no_priority_travels_on_the_wire_and_version_1_records_keep_theirs() -> None:
    codec = ScheduleCodec()
    unnamed = Schedule(name="n", cron="* * * * *", job_type="t", payload=b"{}", created_at=1)
    assert codec.decode(codec.encode(unnamed)) == unnamed
    named = Schedule(
        name="n", cron="* * * * *", job_type="t", payload=b"{}", priority=Priority.DEFAULT,
        created_at=1,
    )  # fmt: skip
    assert codec.decode(codec.encode(named)).priority == Priority.DEFAULT
    # A record of schedule.v1 (no priority_from_type field) names its priority.
    v1 = json.loads((SCHEMAS / "pipeline" / "schedule.v1.avsc").read_text())
    store = SchemaStore()
    (entry,) = [e for e in store.versions("pipeline.Schedule") if e.version == 1]
    assert entry.schema == v1
    old = store.encode(
        {"name": "n", "cron": "* * * * *", "job_type": "t", "payload": b"{}", "created_at": 1},
        entry,
    )
    assert codec.decode(old).priority == Priority.DEFAULT
