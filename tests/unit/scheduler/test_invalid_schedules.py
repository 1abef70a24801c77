"""Schedules that can never fire: refused where written, skipped (never fatal) where read."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from pipeline import Pipeline
from pipeline._codec import ScheduleCodec
from pipeline._errors import ConfigurationError, PayloadValidationError
from pipeline._records import Schedule
from pipeline._schedule import check_schedule, decode_schedule, make_schedule
from pipeline._settings import Settings
from pipeline_scheduler._cron import CronTable

EVERY_10S = "* * * * * */10"
LAST = 1_700_000_000_000  # a fire time (multiple of 10 s)


def raw(name: str = "x", cron: str = EVERY_10S, tz: str = "UTC", **fields: Any) -> Schedule:
    """A record as any writer may send it: built directly, not through make_schedule."""
    return Schedule(name=name, cron=cron, job_type="t", payload=b"{}", timezone=tz, **fields)


@pytest.mark.parametrize(
    ("cron", "tz", "error"),
    [
        ("0 3 30 2 *", "UTC", "never fires in the 10 years"),  # February 30th
        ("0 0 31 4 *", "UTC", "never fires"),  # April 31st
        ("0 0 1 1 * 0 2020", "UTC", "never fires"),  # a year gone by
        ("61 * * * *", "UTC", "invalid cron expression"),
        # croniter accepts a range from 0 to itself in the day or month field, but not 0.
        ("0 0 1 0-0 *", "UTC", "invalid cron expression"),
        ("0 0 0-0 * *", "UTC", "invalid cron expression"),
        ("* * * * *", "America", "unknown time zone"),  # a directory of the tz database
        ("* * * * *", "x" * 300, "unknown time zone"),  # a name too long for a file
        ("* * * * *", "", "unknown time zone"),
        # The zone of whichever machine reads it: schedulers in other zones fire at other times.
        ("* * * * *", "localtime", "the zone of the machine"),
        # croniter draws a random value at every evaluation: fire times nobody agrees on.
        ("R * * * *", "UTC", "random value"),
        ("0 R(1-5) * * *", "UTC", "random value"),
        ("0 0 * * R", "UTC", "random value"),
    ],
)
def test_a_schedule_that_cannot_fire_is_refused(cron: str, tz: str, error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        make_schedule("x", cron=cron, job_type="t", tz=tz)
    app = Pipeline(Settings(namespace="unit"))
    with pytest.raises(ConfigurationError, match=error):
        app.schedule("x", cron=cron, job_type="t", tz=tz)
    assert app.schedules == {}
    with pytest.raises(ConfigurationError, match=error):
        check_schedule(raw(cron=cron, tz=tz))


def test_rare_but_real_dates_are_accepted() -> None:
    # From 2096-03-01 the next February 29th is in 2104 (2100 is no leap year): 8 years.
    march_2096 = int(datetime(2096, 3, 1, tzinfo=UTC).timestamp() * 1000)
    check_schedule(raw(cron="0 0 29 2 *"), now=march_2096)
    make_schedule("leap", cron="0 0 29 2 *", job_type="t")


def test_bad_options_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        check_schedule(raw(max_attempts=0))
    with pytest.raises(ConfigurationError, match="unknown priority"):
        make_schedule("x", cron=EVERY_10S, job_type="t", priority="urgent")
    with pytest.raises(ConfigurationError, match="schedule name"):
        make_schedule("", cron=EVERY_10S, job_type="t")


def test_a_blank_job_type_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="empty job type"):
        check_schedule(Schedule(name="x", cron=EVERY_10S, job_type=" ", payload=b"{}"))


def test_app_schedule_checks_the_payload_against_a_registered_handler() -> None:
    app = Pipeline(Settings(namespace="unit"))

    @app.job("report.build")
    def build(kind: str) -> None: ...

    with pytest.raises(PayloadValidationError, match=r"report\.build"):
        app.schedule("nightly", cron="0 3 * * *", job_type="report.build", payload={"k": 1})
    # Of the right name and the wrong type: accepted, every fire was dead-lettered
    # (validation_error), where an enqueue refuses it.
    with pytest.raises(PayloadValidationError, match="kind"):
        app.schedule("nightly", cron="0 3 * * *", job_type="report.build", payload={"kind": 5})
    with pytest.raises(PayloadValidationError, match="kind"):
        app.enqueue("report.build", {"kind": 5})
    made = app.schedule("nightly", cron="0 3 * * *", job_type="report.build", payload={"kind": "d"})
    assert app.schedules == {"nightly": made}


def test_decode_schedule_reports_bad_records_and_never_raises() -> None:
    codec = ScheduleCodec()
    good = decode_schedule("x", codec.encode(raw()), codec)
    assert good.problem is None
    assert good.schedule == raw(created_at=good.schedule.created_at if good.schedule else 0)
    garbage = decode_schedule("x", b"not avro at all", codec)
    assert garbage.schedule is None
    assert garbage.problem is not None
    assert garbage.problem.startswith("undecodable record")
    never = decode_schedule("x", codec.encode(raw(cron="0 3 30 2 *")), codec)
    assert never.schedule is not None
    assert never.problem is not None
    assert "never fires" in never.problem
    bad_zone = decode_schedule("x", codec.encode(raw(tz="America")), codec)
    assert bad_zone.problem is not None
    assert "unknown time zone" in bad_zone.problem
    renamed = decode_schedule("y", codec.encode(raw(name="x")), codec)
    assert renamed.problem == "the record's name 'x' differs from its key"


def valid(name: str, created_at: int = LAST) -> Schedule:
    made = make_schedule(name, cron=EVERY_10S, job_type="t", missed="all")
    made.created_at = created_at
    return made


def test_cron_table_skips_an_invalid_schedule_and_fires_the_others() -> None:
    codec = ScheduleCodec()
    table = CronTable(grace_ms=0, max_catchup=100)
    table.load_last_fires({"good": LAST, "bad": LAST})
    table.put("good", valid("good"))
    table.put("bad", valid("bad"))
    assert len(table) == 2
    # The bad record replaces the valid one under its name (a compacted topic keeps the last).
    table.put_record(decode_schedule("bad", codec.encode(raw("bad", cron="0 3 30 2 *")), codec))
    table.put_record(decode_schedule("junk", b"\x00\x01", codec))
    table.put("direct", raw("direct", cron="0 0 31 4 *"))  # checked even without decoding
    assert set(table.invalid) == {"bad", "junk", "direct"}
    assert "never fires" in table.invalid["bad"]
    assert set(table.schedules()) == {"good"}
    assert [(f.schedule.name, f.fire_ms) for f in table.due(LAST + 15_000)] == [
        ("good", LAST + 10_000)
    ]
    # A later valid record replaces the invalid one and goes on from its last fire.
    table.put("bad", valid("bad"))
    assert "bad" not in table.invalid
    assert sorted((f.schedule.name, f.fire_ms) for f in table.due(LAST + 25_000)) == [
        ("bad", LAST + 10_000),
        ("bad", LAST + 20_000),
        ("good", LAST + 20_000),
    ]
    # A tombstone removes an invalid one (and its last fire on the state topic).
    table.put("junk", None)
    assert "junk" not in table.invalid
    assert table.removed == ["junk"]


def test_a_schedule_that_runs_out_of_fires_is_skipped_not_fatal() -> None:
    year = datetime.now(UTC).year + 1
    fire = int(datetime(year, 1, 1, tzinfo=UTC).timestamp() * 1000)
    table = CronTable(grace_ms=60_000, max_catchup=100)
    table.put("once", raw("once", cron=f"0 0 1 1 * 0 {year}", created_at=fire - 1000))
    table.put("good", valid("good", created_at=fire - 1000))
    assert table.invalid == {}
    fires = table.due(fire + 5_000)
    assert sorted((f.schedule.name, f.fire_ms) for f in fires) == [("good", fire), ("once", fire)]
    assert "never fires" in table.invalid["once"]
    assert [f.fire_ms for f in table.due(fire + 15_000)] == [fire + 10_000]


LATE_9999 = int(datetime(9999, 6, 1, tzinfo=UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("cron", "created_at"),
    [
        (EVERY_10S, 2**62),
        (EVERY_10S, -(2**62)),
        (EVERY_10S, 253_402_300_799_000),
        ("0 0 1 1 *", LATE_9999),  # its next fire would be in the year 10000
    ],
)
def test_a_creation_time_out_of_range_is_skipped_not_fatal(cron: str, created_at: int) -> None:
    table = CronTable(grace_ms=0, max_catchup=100)
    table.put("far", raw("far", cron=cron, created_at=created_at))
    table.put("good", valid("good"))
    assert set(table.invalid) == {"far"}
    assert [f.schedule.name for f in table.due(LAST + 15_000)] == ["good"]


@pytest.mark.parametrize("cron", ["0 0 1 0-0 *", "0 0 0-0 * *"])
def test_a_record_croniter_refuses_to_read_is_skipped_not_fatal(cron: str) -> None:
    """Written by another writer, or by a release that let it through: the leader, the
    ``schedules`` commands and the dashboard read it as an invalid schedule, and go on (it
    raised croniter's own error, which stopped every scheduler that took over)."""
    codec = ScheduleCodec()
    record = decode_schedule("zero", codec.encode(raw("zero", cron=cron)), codec)
    assert record.problem is not None
    assert "invalid cron expression" in record.problem
    table = CronTable(grace_ms=0, max_catchup=100)
    table.put("zero", raw("zero", cron=cron, created_at=LAST))
    table.put("good", valid("good"))
    assert set(table.invalid) == {"zero"}
    assert [f.schedule.name for f in table.due(LAST + 15_000)] == ["good"]
