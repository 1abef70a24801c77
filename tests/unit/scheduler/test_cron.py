"""Cron fire times (DST in Europe/Paris), missed-fire policies and fire ids."""

from __future__ import annotations

import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from pipeline import Pipeline
from pipeline._cronexpr import SCAN_BEFORE_JUMP, epoch_ms
from pipeline._errors import ConfigurationError
from pipeline._records import Schedule
from pipeline._schedule import (
    due_fires,
    fire_idempotency_key,
    fire_job,
    fire_job_id,
    fires_between,
    make_schedule,
    next_fire_ms,
    same_definition,
)
from pipeline._settings import Settings
from pipeline_scheduler._cron import CronTable

PARIS = ZoneInfo("Europe/Paris")


def ms(year: int, month: int, day: int, hour: int, minute: int) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=PARIS).timestamp() * 1000)


def local(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, tz=PARIS).isoformat()


def test_next_fire_in_a_time_zone() -> None:
    after = ms(2024, 6, 1, 12, 0)
    assert local(next_fire_ms("0 3 * * *", "Europe/Paris", after)) == "2024-06-02T03:00:00+02:00"


def test_spring_forward_a_nonexistent_time_fires_at_the_first_valid_one() -> None:
    # 2024-03-31 02:00 -> 03:00 in Paris: 02:30 does not exist that day.
    first = next_fire_ms("30 2 * * *", "Europe/Paris", ms(2024, 3, 30, 12, 0))
    second = next_fire_ms("30 2 * * *", "Europe/Paris", first)
    assert local(first) == "2024-03-31T03:00:00+02:00"
    assert local(second) == "2024-04-01T02:30:00+02:00"


def test_fall_back_a_repeated_time_fires_in_both_offsets() -> None:
    # 2024-10-27 03:00 -> 02:00: croniter fires 02:30 of both the summer and the winter hour.
    first = next_fire_ms("30 2 * * *", "Europe/Paris", ms(2024, 10, 26, 12, 0))
    second = next_fire_ms("30 2 * * *", "Europe/Paris", first)
    third = next_fire_ms("30 2 * * *", "Europe/Paris", second)
    assert [local(t) for t in (first, second, third)] == [
        "2024-10-27T02:30:00+02:00",
        "2024-10-27T02:30:00+01:00",
        "2024-10-28T02:30:00+01:00",
    ]
    assert second - first == 3600_000


EVERY_10S = "* * * * * */10"
LAST = 1_700_000_000_000  # a fire time (multiple of 10 s)


@pytest.mark.parametrize(
    ("missed", "expected"),
    [
        ("skip", []),
        ("once", [LAST + 30_000]),
        ("all", [LAST + 10_000, LAST + 20_000, LAST + 30_000]),
    ],
)
def test_missed_policies(missed: str, expected: list[int]) -> None:
    now = LAST + 35_000
    assert due_fires(EVERY_10S, "UTC", LAST, now, missed).fires == expected


def test_late_fires_within_grace_always_fire() -> None:
    now = LAST + 31_000
    skip = due_fires(EVERY_10S, "UTC", LAST, now, "skip", grace_ms=5_000)
    assert skip.fires == [LAST + 30_000]
    once = due_fires(EVERY_10S, "UTC", LAST, now, "once", grace_ms=5_000)
    assert once.fires == [LAST + 20_000, LAST + 30_000]
    assert due_fires(EVERY_10S, "UTC", LAST, LAST + 9_999, "all").fires == []


def test_all_is_capped_to_the_newest_missed_fires_and_the_late_ones_follow() -> None:
    now = LAST + 1_000_000  # 99 missed fires and one on time (grace 0)
    first = due_fires(EVERY_10S, "UTC", LAST, now, "all", limit=5)
    assert first.fires == [now - 10_000 * i for i in range(5, 0, -1)]
    assert (first.last_ms, first.until_ms) == (now - 10_000, now)
    later = now + 20_000  # two more fires since, due the next time the policy applies
    second = due_fires(
        EVERY_10S, "UTC", first.last_ms, later, "all", limit=5, until_ms=first.until_ms
    )
    assert (second.fires, second.last_ms, second.until_ms) == ([now], now, None)


def test_fire_ids_are_deterministic_and_distinct() -> None:
    a = fire_job_id("ns", "nightly", LAST)
    assert a == fire_job_id("ns", "nightly", LAST)
    assert len(a) == 32
    assert int(a, 16) >= 0
    assert a != fire_job_id("ns", "nightly", LAST + 1)
    assert a != fire_job_id("other", "nightly", LAST)
    assert fire_idempotency_key("nightly", LAST) == f"cron:nightly:{LAST}"


def test_fire_job_carries_the_schedule() -> None:
    schedule = make_schedule(
        "n", cron="0 3 * * *", job_type="report", payload={"a": 1}, priority="high"
    )
    job = fire_job(schedule, "ns", LAST, default_max_attempts=5)
    assert job.id == fire_job_id("ns", "n", LAST)
    assert job.idempotency_key == f"cron:n:{LAST}"
    assert job.priority.value == "high"
    assert job.payload == b'{"a":1}' or job.payload.replace(b" ", b"") == b'{"a":1}'
    assert job.headers["pipeline-schedule"] == "n"
    assert job.max_attempts == 5


def test_validation() -> None:
    with pytest.raises(ConfigurationError, match="invalid cron"):
        make_schedule("x", cron="61 * * * *", job_type="t")
    with pytest.raises(ConfigurationError, match="unknown time zone"):
        make_schedule("x", cron="* * * * *", job_type="t", tz="Nowhere/Land")
    with pytest.raises(ConfigurationError, match="skip, once, all"):
        make_schedule("x", cron="* * * * *", job_type="t", missed="sometimes")


def test_seven_fields_end_with_seconds_then_a_year_as_the_refusal_says() -> None:
    """croniter reads a seventh field, the year; the refusal named five or six fields only."""
    after = ms(2024, 6, 1, 12, 0)
    assert local(next_fire_ms("0 9 1 1 * 0 2030", "Europe/Paris", after)) == (
        "2030-01-01T09:00:00+01:00"
    )
    with pytest.raises(ConfigurationError, match=r"or seven with seconds then a year"):
        make_schedule("x", cron="0 0 * * * 5 1", job_type="t")


def test_app_schedule_registers_in_code() -> None:
    app = Pipeline(Settings(namespace="unit"))
    made = app.schedule(
        "nightly-report", cron="0 3 * * *", job_type="report.build", payload={"k": 1},
        tz="Europe/Paris", missed="once",
    )  # fmt: skip
    assert app.schedules == {"nightly-report": made}
    assert made.timezone == "Europe/Paris"
    again = make_schedule(
        "nightly-report", cron="0 3 * * *", job_type="report.build", payload={"k": 1},
        tz="Europe/Paris", missed="once",
    )  # fmt: skip
    assert same_definition(made, again)


def schedule(name: str, missed: str = "all", created_at: int = LAST) -> Schedule:
    made = make_schedule(name, cron=EVERY_10S, job_type="t", missed=missed)
    made.created_at = created_at
    return made


def test_cron_table_fires_each_time_once_and_records_the_last_fire() -> None:
    table = CronTable(grace_ms=0, max_catchup=100)
    table.load_last_fires({"a": LAST})
    table.put("a", schedule("a"))
    assert table.next_due() == LAST + 10_000
    fires = table.due(LAST + 25_000)
    assert [(f.fire_ms, f.last_ms) for f in fires] == [
        (LAST + 10_000, LAST + 20_000),
        (LAST + 20_000, LAST + 20_000),
    ]
    assert table.due(LAST + 25_000) == []
    assert table.next_due() == LAST + 30_000
    table.put("a", schedule("a", missed="skip"))  # a change keeps the last fire
    assert [f.fire_ms for f in table.due(LAST + 55_000)] == [None]
    table.put("a", None)
    assert table.removed == ["a"]
    assert table.next_due() is None


def test_fire_times_are_cut_to_milliseconds_upwards() -> None:
    # Never early: a moment 0.4 ms past a millisecond is due at the next one.
    moment = datetime(2024, 6, 1, 12, 0, 0, 400, tzinfo=PARIS)
    whole = int(datetime(2024, 6, 1, 12, 0, tzinfo=PARIS).timestamp() * 1000)
    assert epoch_ms(moment) == whole + 1
    assert epoch_ms(datetime(2024, 6, 1, 12, 0, tzinfo=PARIS)) == whole
    assert next_fire_ms("* * * * * *", "UTC", whole) == whole + 1000


def test_fires_between_far_apart_times_costs_the_limit_not_the_interval() -> None:
    until = LAST + 30_000 * 10_000  # 30,000 fires of a 10-second schedule
    assert fires_between(EVERY_10S, "UTC", LAST, until, 5) == [
        until - 10_000 * i for i in range(4, -1, -1)
    ]
    # A month of a per-second schedule: 2.6 million fires, stepped through one by one before.
    month_ms = 30 * 86_400_000
    started = time.monotonic()
    fires = fires_between("* * * * * *", "UTC", LAST - month_ms, LAST, 3)
    assert fires == [LAST - 2000, LAST - 1000, LAST]
    assert time.monotonic() - started < 20


def test_cron_table_catches_up_from_the_epoch_in_bounded_time() -> None:
    table = CronTable(grace_ms=0, max_catchup=3)
    table.put("old", schedule("old", created_at=0))  # a writer that left created_at at 0
    started = time.monotonic()
    assert [f.fire_ms for f in table.due(LAST)] == [LAST - 30_000, LAST - 20_000, LAST - 10_000]
    assert [f.fire_ms for f in table.due(LAST)] == [LAST]  # on time (grace 0), the next step
    assert time.monotonic() - started < 20


EVERY_MINUTE = "* * * * *"


@pytest.mark.parametrize("limit", [1, 10, 1000])
@pytest.mark.parametrize("past_the_scan", [1, 2, 3])
def test_fires_between_just_past_the_scan_keeps_the_newest_fires(
    limit: int, past_the_scan: int
) -> None:
    # Once it has stepped through limit + SCAN_BEFORE_JUMP fires it jumps to the newest ones;
    # a gap that ends just after that point used to lose them: [] for 1 + limit + SCAN fires.
    count = limit + SCAN_BEFORE_JUMP + past_the_scan
    last = LAST - LAST % 60_000
    until = last + 60_000 * count
    expected = [until - 60_000 * i for i in range(min(limit, count) - 1, -1, -1)]
    assert fires_between(EVERY_MINUTE, "UTC", last, until, limit) == expected


def test_cron_table_after_a_gap_just_past_the_scan_fires_once_and_moves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 1,002 missed fires of a per-minute schedule: the newest fire was not found, the last fire
    # stayed where it was, and due() planned the same overdue schedule again and again (the
    # leader spun there for good, enqueueing the same fire each turn).
    plans = 0
    plan = CronTable._plan

    def counted(self: CronTable, name: str) -> None:
        nonlocal plans
        plans += 1
        assert plans < 10, "due() keeps planning the same overdue schedule"
        plan(self, name)

    monkeypatch.setattr(CronTable, "_plan", counted)
    last = LAST - LAST % 60_000
    now = last + 60_000 * (2 + SCAN_BEFORE_JUMP)
    table = CronTable(grace_ms=30_000, max_catchup=1000)
    table.load_last_fires({"a": last})
    made = make_schedule("a", cron=EVERY_MINUTE, job_type="t", missed="skip")
    made.created_at = last
    table.put("a", made)
    assert [(f.fire_ms, f.last_ms) for f in table.due(now)] == [(now, now)]
    assert table.next_due() == now + 60_000


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        ("0 9-9 * * *", ["2024-06-02T09:00:00+02:00", "2024-06-03T09:00:00+02:00"]),
        ("0 9-9/2 * * *", ["2024-06-02T09:00:00+02:00", "2024-06-03T09:00:00+02:00"]),
        ("30 8 * * mon-MON", ["2024-06-03T08:30:00+02:00", "2024-06-10T08:30:00+02:00"]),
        ("0 0 1 9-9 *", ["2024-09-01T00:00:00+02:00", "2025-09-01T00:00:00+02:00"]),
        ("0 0 1,15-15 * *", ["2024-06-15T00:00:00+02:00", "2024-07-01T00:00:00+02:00"]),
        ("0 22-2 * * *", ["2024-06-01T22:00:00+02:00", "2024-06-01T23:00:00+02:00"]),
    ],
)
def test_a_range_from_a_value_to_itself_is_that_value(cron: str, expected: list[str]) -> None:
    """croniter read ``9-9`` as a range wrapping around the whole field: a schedule for 09:00
    fired every hour (every day, every month). Cron reads it as 9; a wrapping range of two
    values still wraps."""
    first = next_fire_ms(cron, "Europe/Paris", ms(2024, 6, 1, 12, 0))
    second = next_fire_ms(cron, "Europe/Paris", first)
    assert [local(first), local(second)] == expected
    assert fires_between(cron, "Europe/Paris", first - 1, second, 10) == [first, second]


def test_a_schedule_removed_and_added_again_keeps_its_last_fire_through_a_takeover() -> None:
    """A new leader loads the last fires, then reads the schedules' history: the schedule, its
    removal and the schedule added again. The removal must not drop the last fire loaded, or
    the fires done since the schedule was added again fire again (and its state record is
    tombstoned after the new last fire, losing it again)."""
    added_again = LAST - 100_000
    table = CronTable(grace_ms=0, max_catchup=100)
    table.load_last_fires({"a": LAST})
    table.put("a", schedule("a", created_at=LAST - 500_000))
    table.put("a", None)
    table.put("a", schedule("a", created_at=added_again))
    assert table.removed == []  # no tombstone for its state record
    assert [f.fire_ms for f in table.due(LAST + 15_000)] == [LAST + 10_000]
    # Removed for good: its state record is tombstoned at the next fire.
    table.put("a", None)
    assert table.removed == ["a"]
    assert table.next_due() is None


@pytest.mark.parametrize(
    ("cron", "expected"),
    [
        # A stepped `*` restricts nothing, as in cron: odd days that are Mondays.
        ("0 0 */2 * 1", ["2024-06-03T00:00:00+02:00", "2024-06-17T00:00:00+02:00"]),
        ("0 0 * * 1", ["2024-06-03T00:00:00+02:00", "2024-06-10T00:00:00+02:00"]),
        ("0 0 1 * */3", ["2024-06-01T00:00:00+02:00", "2024-09-01T00:00:00+02:00"]),
        # Two restricted day fields: either matches, as in cron.
        ("0 0 5 * 1", ["2024-06-03T00:00:00+02:00", "2024-06-05T00:00:00+02:00"]),
    ],
)
def test_day_fields_combine_as_cron_combines_them(cron: str, expected: list[str]) -> None:
    """croniter fired a day matching either field even when one was a stepped ``*``: a
    crontab line ``0 0 */2 * 1`` fired every other day and on Mondays."""
    first = next_fire_ms(cron, "Europe/Paris", ms(2024, 5, 31, 23, 0))
    second = next_fire_ms(cron, "Europe/Paris", first)
    assert [local(first), local(second)] == expected
