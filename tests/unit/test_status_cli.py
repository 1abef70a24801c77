"""``pipeline status``, ``jobs show`` and ``events tail`` without a broker: argument errors,
Kafka unreachable, and what a snapshot computes and prints."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from pipeline import Settings, _status
from pipeline._backlogmodel import GroupMember, GroupMembers, PartitionBacklog, TopicBacklog
from pipeline._deadletters import LetterState, LetterStatus, StoredLetter
from pipeline._eventlog import EventFilter, JobHistory, in_time_order
from pipeline._records import DeadLetter, Event, Schedule
from pipeline._status import ScheduleDue, StatusSnapshot, rates
from pipeline_cli._main import cli
from pipeline_cli._statusrender import print_status, status_json

NOWHERE = ["--bootstrap-servers", "127.0.0.1:1", "--timeout", "1"]
AT = 1_700_000_000_000


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--watch", "0.1"],
        ["status", "--count", "2"],
        ["status", "--watch", "soon"],
        ["jobs", "show"],
        ["events", "tail", "--kind", "exploded"],
        ["events", "tail", "--max", "0"],
        ["events", "tail", "--until-idle", "-1"],
    ],
)
def test_wrong_arguments_exit_2_with_a_message(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, *NOWHERE])
    assert result.exit_code == 2, result.output
    assert "Error" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["status", "--json"],
        ["status", "--watch", "--count", "1"],  # --watch without SECONDS: the default
        ["jobs", "show", "abc"],
        ["events", "tail"],
    ],
)
def test_kafka_unreachable_exits_1_saying_so(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, *NOWHERE])
    assert result.exit_code == 1, result.output
    assert "Kafka at 127.0.0.1:1 did not answer" in result.output
    assert "Traceback" not in result.output


def lag(name: str, *parts: PartitionBacklog) -> TopicBacklog:
    return TopicBacklog(f"ns.jobs.{name}", "ns.workers", parts)


def snapshot(at: int = AT, *, end: int = 10, committed: int | None = 4) -> StatusSnapshot:
    worker = GroupMember("worker-1", "10.0.0.7", (("ns.jobs.high", 0), ("ns.jobs.low", 0)), "m1")
    leader = GroupMember("sched-a", "10.0.0.8", (("ns.scheduler-control", 0),), "s1")
    standby = GroupMember("sched-b", "10.0.0.9", (), "s2")
    return StatusSnapshot(
        namespace="ns",
        at=at,
        priorities=(
            lag("high", PartitionBacklog(0, 0, end, committed, AT - 90_000)),
            lag("low", PartitionBacklog(0, 2, 2, None, None)),
        ),
        retry_tiers=(),
        deferred=(),
        workers=GroupMembers("ns.workers", "STABLE", (worker,)),
        scheduler=GroupMembers("ns.scheduler", "STABLE", (leader, standby)),
        dead_letters_pending=3,
        schedules=(
            ScheduleDue("nightly", "0 3 * * *", "UTC", "report", True, None, AT - 5_000),
            ScheduleDue("off", "* * * * *", "UTC", "noop", False, None, AT - 60_000),
        ),
    )


def test_backlog_counts_from_the_commit_or_else_the_earliest_offset() -> None:
    assert PartitionBacklog(0, 0, 10, 4, None).waiting == 6
    assert PartitionBacklog(0, 3, 10, None, None).waiting == 7  # nothing committed: from the start
    assert PartitionBacklog(0, 8, 10, 5, None).waiting == 2  # committed below what is retained
    high = snapshot().priorities[0]
    assert high.oldest_age_s(AT) == 90.0
    assert snapshot().priorities[1].oldest_age_s(AT) is None


def test_backlog_starts_at_the_first_message_a_worker_would_run() -> None:
    # aborted messages and markers from the commit to offset 7 are no jobs
    assert PartitionBacklog(0, 0, 10, 4, AT, first=7).waiting == 3
    # only aborted messages and markers after the commit: nothing waits
    assert PartitionBacklog(0, 0, 10, 4, None, first=10).waiting == 0
    assert PartitionBacklog(0, 0, 10, 4, None, first=None).waiting == 6  # not read


def test_rates_compare_two_snapshots() -> None:
    before = snapshot(AT, end=10, committed=4).priorities[0]
    after = snapshot(AT + 2000, end=30, committed=14).priorities[0]
    assert rates(before, after, 2.0) == (10.0, 5.0)
    assert rates(before, after, 0.0) == (0.0, 0.0)


def test_a_partition_whose_commit_went_back_does_not_cancel_the_others() -> None:
    # partition 0's offsets were reset to re-run jobs; partition 1 committed 60 meanwhile
    before = lag(
        "high", PartitionBacklog(0, 0, 100, 100, None), PartitionBacklog(1, 0, 100, 0, None)
    )
    after = lag(
        "high", PartitionBacklog(0, 0, 100, 10, None), PartitionBacklog(1, 0, 100, 60, None)
    )
    assert rates(before, after, 2.0) == (0.0, 30.0)


def test_retention_is_no_job_done_and_a_recreated_topic_counts_from_zero() -> None:
    # no worker ever committed: retention moving the start is no job done
    before = lag("low", PartitionBacklog(0, 0, 100, None, None))
    after = lag("low", PartitionBacklog(0, 50, 100, None, None))
    assert rates(before, after, 2.0) == (0.0, 0.0)
    # nor under a commit retention left behind (the workers down longer than retention)
    before = lag("low", PartitionBacklog(0, 300, 600, 100, None))
    after = lag("low", PartitionBacklog(0, 500, 600, 100, None))
    assert rates(before, after, 10.0) == (0.0, 0.0)
    # the topic was recreated: 20 and 30 written since, as a counter reset is counted
    before = lag(
        "low", PartitionBacklog(0, 0, 100, None, None), PartitionBacklog(1, 0, 100, None, None)
    )
    after = lag(
        "low", PartitionBacklog(0, 0, 20, None, None), PartitionBacklog(1, 0, 30, None, None)
    )
    assert rates(before, after, 2.0) == (25.0, 0.0)
    # a partition added since counts from offset 0
    one = lag("low", PartitionBacklog(0, 0, 100, None, None))
    grown = lag("low", PartitionBacklog(0, 0, 100, None, None), PartitionBacklog(1, 0, 8, 8, None))
    assert rates(one, grown, 2.0) == (4.0, 4.0)


def test_the_leader_owns_the_control_partition_and_cron_lateness_skips_disabled() -> None:
    taken = snapshot()
    assert taken.leader is not None
    assert taken.leader.client_id == "sched-a"
    assert taken.cron_lateness_s == 5.0


def test_json_has_stable_keys_and_rates_only_with_a_previous_snapshot() -> None:
    first = status_json(snapshot(), None)
    assert list(first) == [
        "namespace",
        "at",
        "at_ms",
        "priorities",
        "retry_tiers",
        "deferred",
        "workers",
        "scheduler",
        "dead_letters_pending",
        "schedules",
    ]
    assert first["priorities"][0]["rate_in"] is None
    assert first["scheduler"]["leader"]["client_id"] == "sched-a"
    assert first["workers"]["members"][0]["partitions"] == ["ns.jobs.high[0]", "ns.jobs.low[0]"]
    second = status_json(snapshot(AT + 2000, end=30, committed=14), snapshot())
    assert second["priorities"][0]["rate_in"] == 10.0
    assert second["priorities"][0]["rate_out"] == 5.0
    json.dumps(second)  # serializable as it is


def test_the_table_shows_backlog_age_workers_scheduler_and_schedules(
    capsys: pytest.CaptureFixture[str],
) -> None:
    print_status(snapshot(), None)
    out = capsys.readouterr().out
    lines = out.splitlines()
    high = next(line for line in lines if line.startswith("high "))
    assert high.split() == ["high", "ns.jobs.high", "6", "90s", "n/a", "n/a"]
    assert "workers: group ns.workers (stable), 1 member" in out
    assert "0 of 2 topics" in out
    assert "scheduler: leader sched-a on 10.0.0.8, 1 standby; cron lateness 5.0s" in out
    assert "dead letters pending: 3" in out
    assert "disabled" in out


def event(kind: str, at: int, job_type: str = "email.send", attempt: int = 1) -> Event:
    return Event(
        job_id="j1", job_type=job_type, kind=kind, attempt=attempt, priority="default", at=at
    )


def test_event_filter_matches_types_kinds_and_jobs() -> None:
    assert EventFilter().matches(event("started", 1))
    assert EventFilter(types=["email.*"], kinds=["started"]).matches(event("started", 1))
    assert not EventFilter(kinds=["dead"]).matches(event("started", 1))
    assert not EventFilter(types=["sms.*"]).matches(event("started", 1))
    assert not EventFilter(job_ids=["j2"]).matches(event("started", 1))


def test_events_of_one_millisecond_keep_the_order_they_happened_in() -> None:
    # As read from the topic: the move's transaction wrote "dead" before the best-effort
    # producer wrote "started", both stamped in the same millisecond.
    read = [
        event("dead", 7, attempt=2),
        event("started", 7, attempt=2),
        event("retried", 5, attempt=1),
        event("started", 5, attempt=1),
        event("replayed", 7, attempt=3),  # the attempt it sends
    ]
    ordered = in_time_order(read)
    assert [(e.kind, e.attempt) for e in ordered] == [
        ("started", 1),
        ("retried", 1),
        ("started", 2),
        ("dead", 2),
        ("replayed", 3),
    ]
    letter = DeadLetter(
        reason="fatal_error", message="no", source_topic="t", source_partition=0, source_offset=0
    )
    assert JobHistory("j1", ordered[:4], [StoredLetter(letter, 0, 0)]).state == "dead (pending)"


def test_a_job_history_says_where_the_job_is() -> None:
    assert JobHistory("j1").state == "unknown"
    assert JobHistory("j1", [event("started", 1), event("succeeded", 2)]).state == "succeeded"
    assert JobHistory("j1", [event("retried", 1)]).state == "waiting for a retry"
    letter = DeadLetter(
        reason="fatal_error", message="no", source_topic="t", source_partition=0, source_offset=0
    )
    dead = JobHistory("j1", [event("dead", 1)], [StoredLetter(letter, 0, 0)])
    assert dead.state == "dead (pending)"
    replayed = LetterState(status=LetterStatus.REPLAYED, at=3, by="op")
    again = JobHistory(
        "j1",
        [event("dead", 1), event("replayed", 3, attempt=2)],
        [StoredLetter(letter, 0, 0, replayed)],
    )
    assert again.state == "replayed, waiting to run"


def test_a_discarded_dead_letter_is_a_dead_job_whether_or_not_its_event_was_read() -> None:
    letter = DeadLetter(
        reason="fatal_error", message="no", source_topic="t", source_partition=0, source_offset=0
    )
    discarded = LetterState(status=LetterStatus.DISCARDED, at=3, by="op")
    stored = [StoredLetter(letter, 0, 0, discarded)]
    assert JobHistory("j1", [], stored).state == "dead (discarded)"
    assert JobHistory("j1", [event("dead", 1), event("discarded", 3)], stored).state == (
        "dead (discarded)"
    )


def test_a_schedule_out_of_fires_since_its_last_shows_no_next_fire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valid when written (it fires in 2038, within 10 years of 2029), it has no fire within 10
    years of its last (2027): the status shows no next fire, as the scheduler skips it, instead
    of failing whole with a usage error."""

    def jan1(year: int) -> int:
        return int(datetime(year, 1, 1, tzinfo=UTC).timestamp() * 1000)

    yearly = Schedule(
        name="yearly", cron="0 0 1 1 * 0 2027,2038", job_type="x", payload=b"{}",
        created_at=jan1(2026),
    )  # fmt: skip
    monkeypatch.setattr(_status, "read_schedules", lambda settings, timeout: {"yearly": yearly})
    last = {"yearly": jan1(2027)}
    monkeypatch.setattr(_status, "read_last_fires", lambda settings, timeout: last)
    [due] = _status._schedules(Settings(), 1.0)
    assert due.name == "yearly"
    assert due.next_fire is None


def test_the_run_a_replay_sent_says_where_the_job_is_whatever_the_clocks() -> None:
    """A replay is stamped by the operator's clock, its run by the worker's: the replay sorted
    after a run in the same millisecond, or a few milliseconds later, and the job was said to be
    "replayed, waiting to run" after it had died again, or succeeded."""
    letter = DeadLetter(
        reason="fatal_error", message="no", source_topic="t", source_partition=0, source_offset=0
    )
    replayed = StoredLetter(letter, 0, 0, LetterState(status=LetterStatus.REPLAYED, at=5, by="o"))
    pending = StoredLetter(letter, 0, 1)
    died = [event("dead", 1), event("replayed", 5, attempt=2)]
    died += [event("started", 5, attempt=2), event("dead", 5, attempt=2)]
    assert JobHistory("j1", in_time_order(died), [replayed, pending]).state == "dead (pending)"
    # The operator's clock 50 ms ahead of the worker's: the run came first, by the clocks.
    ran = [event("dead", 1), event("started", 20, attempt=2), event("succeeded", 30, attempt=2)]
    ran.append(event("replayed", 70, attempt=2))
    assert JobHistory("j1", in_time_order(ran), [replayed]).state == "succeeded"
    # Replayed with its attempts reset: the old run's events do not count as the new one's.
    reset = [event("started", 1, attempt=3), event("dead", 2, attempt=3)]
    reset.append(event("replayed", 9_000, attempt=1))
    assert JobHistory("j1", reset, [replayed]).state == "replayed, waiting to run"


def test_a_job_read_again_after_it_succeeded_is_said_to_have_succeeded() -> None:
    """Read again under its own id (a crash before its offset's commit, a client that sent it
    twice): its key says it is done, and the worker tells it was skipped."""
    history = [event("started", 1), event("succeeded", 2), event("deduplicated", 3)]
    assert JobHistory("j1", history).state == "succeeded"
    assert JobHistory("j1", [event("deduplicated", 3)]).state == "skipped as a duplicate"


def test_a_timed_out_attempt_s_progress_does_not_say_the_job_runs() -> None:
    """A plain function past its time limit goes on on its thread and calls ``ctx.progress()``:
    its attempt was retried (or the job succeeded at the next one) all the same."""
    retried = [event("started", 0), event("retried", 5_000), event("progress", 6_000)]
    assert JobHistory("j1", retried).state == "waiting for a retry"
    succeeded = [*retried[:2], event("started", 7_000, attempt=2)]
    succeeded += [event("succeeded", 7_100, attempt=2), event("progress", 8_000)]
    assert JobHistory("j1", succeeded).state == "succeeded"
    # A replay with its attempts reset runs attempt 1 again: that run's progress counts.
    letter = DeadLetter(
        reason="fatal_error", message="no", source_topic="t", source_partition=0, source_offset=0
    )
    replayed = StoredLetter(letter, 0, 0, LetterState(status=LetterStatus.REPLAYED, at=9, by="o"))
    again = [event("started", 0), event("dead", 5), event("replayed", 9_000)]
    again += [event("started", 9_500), event("progress", 9_800)]
    assert JobHistory("j1", again, [replayed]).state == "running (or its worker stopped)"


def test_a_reset_replay_within_the_clocks_margin_is_not_the_death_it_answered() -> None:
    # The operator replayed with --reset-attempts 500 ms after the job died at attempt 3.
    letter = DeadLetter(
        reason="fatal_error", message="no", source_topic="t", source_partition=0, source_offset=0
    )
    replayed = StoredLetter(letter, 0, 0, LetterState(status=LetterStatus.REPLAYED, at=9, by="o"))
    reset = [event("started", 1_000, attempt=3), event("dead", 1_200, attempt=3)]
    reset.append(event("replayed", 1_700, attempt=1))
    assert JobHistory("j1", reset, [replayed]).state == "replayed, waiting to run"
