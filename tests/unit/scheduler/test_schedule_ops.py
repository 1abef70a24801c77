"""Pause, resume and trigger without a broker: where fires count from, and manual fire ids."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import KafkaUnavailableError, PipelineError, Settings
from pipeline._dedup import Verdict
from pipeline._deduptable import DedupTable
from pipeline._job import Priority
from pipeline._records import Schedule
from pipeline._schedule import count_from, fire_job, make_schedule
from pipeline._scheduleops import TRIGGER_HEADER, trigger_idempotency_key, trigger_job
from pipeline._scheduletable import _write, read_schedules
from pipeline_scheduler._cron import CronTable

EVERY_10S = "* * * * * */10"
LAST = 1_700_000_000_000  # a fire time (multiple of 10 s)
PAUSED = LAST + 5_000
RESUMED = LAST + 65_000


def schedule(missed: str, created_at: int, enabled: bool = True) -> Schedule:
    made = make_schedule("s", cron=EVERY_10S, job_type="t", missed=missed, enabled=enabled)
    return replace(made, created_at=created_at)


def test_fires_count_from_the_later_of_the_last_fire_and_the_record() -> None:
    s = make_schedule("s", cron=EVERY_10S, job_type="t")
    s = replace(s, created_at=RESUMED)
    assert count_from(s, None) == RESUMED
    assert count_from(s, LAST) == RESUMED
    assert count_from(s, RESUMED + 10_000) == RESUMED + 10_000


def test_a_resumed_schedule_never_fires_for_its_paused_time_even_with_missed_all() -> None:
    table = CronTable(grace_ms=60_000, max_catchup=100)  # every paused fire is within grace
    table.load_last_fires({"s": LAST})
    table.put("s", schedule("all", LAST - 100_000))
    table.put("s", schedule("all", PAUSED, enabled=False))
    assert table.next_due() is None
    assert table.due(RESUMED) == []
    table.put("s", schedule("all", RESUMED))
    assert table.next_due() == LAST + 70_000
    assert [f.fire_ms for f in table.due(LAST + 75_000)] == [LAST + 70_000]


def test_fires_missed_after_the_resume_follow_the_policy() -> None:
    """Paused, resumed, and all of it while no scheduler ran: a new leader loads the old last
    fire and only the latest record; the fires after the resume are missed ones."""
    for missed, expected in [
        ("all", [LAST + 70_000, LAST + 80_000, LAST + 90_000]),
        ("once", [LAST + 90_000]),
        ("skip", [None]),
    ]:
        table = CronTable(grace_ms=0, max_catchup=100)
        table.put("s", schedule(missed, RESUMED))
        table.load_last_fires({"s": LAST})  # either order: the state is read after the table
        fires = table.due(LAST + 95_000)
        assert [f.fire_ms for f in fires] == expected, missed
        assert fires[-1].last_ms == LAST + 90_000


def test_an_unchanged_record_goes_on_from_its_last_fire() -> None:
    """A record written before the last fire (an `add` of an unchanged definition writes
    nothing, so it keeps its created_at) catches up from the last fire, as before."""
    table = CronTable(grace_ms=0, max_catchup=100)
    table.load_last_fires({"s": LAST})
    table.put("s", schedule("all", LAST - 100_000))
    assert [f.fire_ms for f in table.due(LAST + 25_000)] == [LAST + 10_000, LAST + 20_000]


def test_a_manual_fire_is_the_cron_fire_with_its_own_id_and_key() -> None:
    s = make_schedule("s", cron=EVERY_10S, job_type="t", payload={"a": 1}, headers={"h": "v"})
    cron = fire_job(s, "ns", LAST, 7)
    manual = trigger_job(s, "ns", LAST, 7)
    again = trigger_job(s, "ns", LAST, 7)
    assert manual.idempotency_key == again.idempotency_key == trigger_idempotency_key("s", LAST)
    assert manual.idempotency_key == f"manual:s:{LAST}"
    assert manual.idempotency_key != cron.idempotency_key
    assert trigger_idempotency_key("s", LAST + 1) != manual.idempotency_key
    assert len({cron.id, manual.id, again.id}) == 3
    assert manual.headers == {"h": "v", "pipeline-schedule": "s", TRIGGER_HEADER: "manual"}
    assert (manual.payload, manual.type, manual.not_before) == (cron.payload, "t", None)
    assert (manual.priority, manual.max_attempts) == (Priority.DEFAULT, 7)
    named = replace(s, priority=Priority.HIGH, max_attempts=2)
    assert (
        trigger_job(named, "ns", LAST, 7).priority,
        trigger_job(named, "ns", LAST, 7).max_attempts,
    ) == (
        Priority.HIGH,
        2,
    )


def test_manual_keys_never_equal_cron_keys_whatever_the_names() -> None:
    names = ["a", "a:1", "manual", "manual:a", "cron", "cron:a", ""]
    cron = {
        fire_job(make_schedule(n or "x", cron=EVERY_10S, job_type="t"), "ns", 1, 1).idempotency_key
        for n in names
    }
    manual = {trigger_idempotency_key(n, t) for n in names for t in (1, 11)}
    assert cron.isdisjoint(manual)


def test_why_each_manual_fire_has_its_own_job_id() -> None:
    """A worker runs a second copy of one job id while the first is pending (a retry, to it);
    a copy with another id and the same key is a duplicate."""
    table = DedupTable()
    key = trigger_idempotency_key("s", LAST)
    assert table.check(key, "job-1", LAST, 60_000) is Verdict.RUN
    assert table.check(key, "job-1", LAST, 60_000) is Verdict.RETRY  # would run twice
    assert table.check(key, "job-2", LAST, 60_000) is Verdict.DUPLICATE


def test_a_schedule_too_large_to_send_is_a_clear_error() -> None:
    """librdkafka refuses it before sending (no broker needed): that was a traceback."""
    settings = Settings(namespace="acme", bootstrap_servers="127.0.0.1:9")
    with pytest.raises(PipelineError, match=r"'big' could not be written: .*too large"):
        _write(settings, [("big", b"x" * 2_000_000)], timeout=1.0)


def test_reading_schedules_while_kafka_is_down_prints_no_client_lines(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """librdkafka printed hundreds of `%3|...|FAIL|` lines before the one-line error."""
    settings = Settings(namespace="acme", bootstrap_servers="127.0.0.1:9")
    with pytest.raises(KafkaUnavailableError, match=r"127\.0\.0\.1:9 did not answer within 2s"):
        read_schedules(settings, timeout=2.0)
    assert "|FAIL|" not in capfd.readouterr().err


class _LeaderGone:
    """A consumer whose metadata answers but whose partition leader does not (a broker of a
    cluster down, or Kafka going away in the middle of the read)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.closed = False

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        partitions = {0: SimpleNamespace(id=0)}
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=partitions)})

    def get_watermark_offsets(self, tp: Any, timeout: float = -1, cached: bool = False) -> Any:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))

    def poll(self, timeout: float = -1) -> None:
        return None

    def close(self) -> None:
        self.closed = True


def test_a_partition_leader_that_does_not_answer_is_kafka_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The raw KafkaException of the watermark request escaped: `pipeline status` and
    `pipeline schedules ls` printed a traceback."""
    monkeypatch.setattr("confluent_kafka.Consumer", _LeaderGone)
    settings = Settings(namespace="acme", bootstrap_servers="127.0.0.1:9")
    with pytest.raises(KafkaUnavailableError, match=r"the end of acme\.schedules: Local: Timed"):
        read_schedules(settings, timeout=1.0)
