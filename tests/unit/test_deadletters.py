"""Dead letters without Kafka: filters, times, what a replay sends, state folding and counts."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from click.testing import CliRunner

from pipeline import Settings
from pipeline._codec import JobCodec
from pipeline._deadletters import (
    DeadLetterNotFoundError,
    DeadLetterSnapshot,
    LetterFilter,
    LetterState,
    LetterStatus,
    StoredLetter,
    _reader,
    actionable,
    dlq_stats,
    dlq_transactional_id,
    fold_states,
    parse_when,
    replay_job,
    replay_message,
)
from pipeline._errors import PipelineError
from pipeline._human import when
from pipeline._job import AttemptError, Job, Priority
from pipeline._records import DeadLetter
from pipeline_cli._main import cli

NOW = 1_767_225_600_000  # 2026-01-01T00:00:00Z
HOUR = 3_600_000


def attempt_error(attempt: int, error_class: str, message: str) -> AttemptError:
    return AttemptError(
        attempt=attempt, at=NOW - HOUR, error_class=error_class, message=message, retryable=True
    )


def job(
    job_id: str = "job-1",
    job_type: str = "email.send",
    *,
    attempt: int = 5,
    priority: Priority = Priority.DEFAULT,
    idempotency_key: str | None = None,
    tenant: str | None = None,
) -> Job:
    return Job(
        id=job_id,
        type=job_type,
        payload=b'{"to":"a@b.c"}',
        priority=priority,
        attempt=attempt,
        max_attempts=5,
        not_before=NOW - 2 * HOUR,
        idempotency_key=idempotency_key,
        tenant=tenant,
        headers={"traceparent": "00-abc-01"},
        errors=[
            attempt_error(1, "smtplib.SMTPServerDisconnected", "Connection unexpectedly closed"),
            attempt_error(2, "builtins.TimeoutError", "smtp timed out"),
        ],
    )


def letter(
    letter_id: str = "dl-1",
    the_job: Job | None = None,
    *,
    reason: str = "max_attempts",
    dead_at: int = NOW,
    error_class: str | None = "builtins.TimeoutError",
    message: str = "smtp timed out",
) -> DeadLetter:
    return DeadLetter(
        id=letter_id,
        reason=reason,
        message=message,
        error_class=error_class,
        source_topic="ns.jobs.default",
        source_partition=2,
        source_offset=40,
        job=the_job if the_job is not None else job(),
        raw_key=b"original-key",
        dead_at=dead_at,
    )


def raw_letter(letter_id: str = "dl-raw") -> DeadLetter:
    return DeadLetter(
        id=letter_id,
        reason="decode_error",
        message="unknown writer schema fingerprint",
        source_topic="ns.jobs.low",
        source_partition=1,
        source_offset=7,
        raw_value=b"\x00\x01not avro",
        raw_key=b"k1",
        raw_headers={"h": b"v", "empty": b""},
        dead_at=NOW,
    )


# --- times ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", NOW - 30 * 60_000),
        ("2h", NOW - 2 * HOUR),
        ("7d", NOW - 7 * 24 * HOUR),
        ("1w", NOW - 7 * 24 * HOUR),
        ("45s", NOW - 45_000),
        ("1h30m", NOW - 90 * 60_000),
        ("1.5h", NOW - 90 * 60_000),
        (" 2h ", NOW - 2 * HOUR),
        ("2026-01-01T00:00:00Z", NOW),
        ("2026-01-01T01:00:00+01:00", NOW),
        ("2026-01-01T00:00:00", NOW),  # no offset: UTC
        ("2026-01-01 00:00", NOW),
        ("2026-01-01", NOW),
        ("2025-12-31T23:59:59.5Z", NOW - 500),
    ],
)
def test_parse_when_takes_iso_datetimes_and_durations_ago(text: str, expected: int) -> None:
    assert parse_when(text, now=NOW) == expected


@pytest.mark.parametrize("text", ["yesterdayish", "", "5x", "-3h", "h", "2h ago", "2026-13-01"])
def test_parse_when_refuses_anything_else_saying_what_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match="neither an ISO-8601 datetime") as caught:
        parse_when(text, now=NOW)
    assert "30m, 2h, 7d" in str(caught.value)


def test_parse_when_defaults_to_the_current_time() -> None:
    before = int(datetime.now(UTC).timestamp() * 1000)
    assert before - HOUR - 5_000 <= parse_when("1h") <= before - HOUR + 5_000


# --- filters --------------------------------------------------------------------------------


def test_an_empty_filter_matches_everything() -> None:
    assert LetterFilter().empty
    assert LetterFilter().matches(letter())
    assert LetterFilter().matches(raw_letter())
    assert not LetterFilter(types=("x",)).empty
    assert not LetterFilter(since=0).empty


def test_type_filter_is_exact_or_a_wildcard() -> None:
    report = letter(the_job=job(job_type="report.build"))
    assert LetterFilter(types=("email.send",)).matches(letter())
    assert not LetterFilter(types=("email",)).matches(letter())
    assert LetterFilter(types=("email.*",)).matches(letter())
    assert not LetterFilter(types=("email.*",)).matches(report)
    assert LetterFilter(types=("email.send", "report.build")).matches(report)
    assert LetterFilter(types=("*",)).matches(report)
    assert not LetterFilter(types=("*",)).matches(raw_letter())  # no type matches no --type
    assert not LetterFilter(types=("email.send",)).matches(raw_letter())


def test_reason_filter_ignores_case() -> None:
    assert LetterFilter(reasons=("MAX_ATTEMPTS",)).matches(letter())
    assert not LetterFilter(reasons=("fatal_error",)).matches(letter())
    assert LetterFilter(reasons=("fatal_error", "decode_error")).matches(raw_letter())


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("timeouterror", True),  # the dead letter's error class
        ("SMTP TIMED", True),  # its message
        ("SMTPServerDisconnected", True),  # an earlier attempt's class
        ("unexpectedly closed", True),  # an earlier attempt's message
        ("refused", False),
    ],
)
def test_error_filter_searches_the_letter_and_every_attempt(text: str, matches: bool) -> None:
    assert LetterFilter(error=text).matches(letter()) is matches


def test_error_filter_on_a_letter_without_a_job() -> None:
    assert LetterFilter(error="fingerprint").matches(raw_letter())
    assert not LetterFilter(error="timeout").matches(raw_letter())


def test_time_filters_are_since_inclusive_and_until_exclusive() -> None:
    old = letter(dead_at=NOW - 3 * 24 * HOUR)
    assert LetterFilter(since=NOW).matches(letter())
    assert not LetterFilter(since=NOW + 1).matches(letter())
    assert not LetterFilter(until=NOW).matches(letter())
    assert LetterFilter(until=NOW + 1).matches(letter())
    two_days = parse_when("2d", now=NOW)
    assert not LetterFilter(since=two_days).matches(old)
    assert LetterFilter(until=two_days).matches(old)


def test_tenant_and_id_filters() -> None:
    mine = letter(the_job=job(tenant="acme"))
    assert mine.tenant == "acme"
    assert LetterFilter(tenants=("acme", "other")).matches(mine)
    assert not LetterFilter(tenants=("other",)).matches(mine)
    assert not LetterFilter(tenants=("acme",)).matches(raw_letter())
    assert LetterFilter(ids=("dl-1",)).matches(mine)  # dead-letter id
    assert LetterFilter(ids=("nope", "job-1")).matches(mine)  # job id
    assert not LetterFilter(ids=("dl-2",)).matches(mine)
    assert LetterFilter(ids=("dl-raw",)).matches(raw_letter())
    assert not LetterFilter(ids=("",)).matches(raw_letter())  # it has no job id, not an empty one


def test_every_criterion_must_hold() -> None:
    both = LetterFilter(types=("email.send",), reasons=("fatal_error",))
    assert not both.matches(letter())
    assert LetterFilter(types=("email.send",), reasons=("max_attempts",), error="smtp").matches(
        letter()
    )


# --- what a replay sends --------------------------------------------------------------------


def test_replay_gives_one_more_attempt_and_keeps_everything_else() -> None:
    original = job(attempt=5, priority=Priority.HIGH)
    again = replay_job(original)
    assert again.attempt == 6  # past max_attempts: one more failure dead-letters it again
    assert again.not_before is None
    assert (again.id, again.payload, again.headers, again.priority) == (
        original.id,
        original.payload,
        original.headers,
        Priority.HIGH,
    )
    assert again.errors == original.errors
    assert original.attempt == 5  # not modified in place


def test_replay_can_reset_attempts_and_change_priority() -> None:
    again = replay_job(job(attempt=5), reset_attempts=True, priority="critical")
    assert again.attempt == 1
    assert again.priority is Priority.CRITICAL
    assert len(again.errors) == 2
    with pytest.raises(ValueError, match="unknown priority"):
        replay_job(job(), priority="urgent")


def test_replay_message_of_a_job() -> None:
    codec = JobCodec()
    out = replay_message(letter(the_job=job(priority=Priority.HIGH)), "ns", codec=codec)
    assert out.topic == "ns.jobs.high"
    assert out.key == b"original-key"  # no idempotency key: the message's own key
    assert out.headers == []
    decoded = codec.decode(out.value)
    assert (decoded.id, decoded.attempt, decoded.not_before) == ("job-1", 6, None)
    assert decoded.errors == job().errors
    assert out.job == decoded


def test_replay_message_options_and_idempotency_key() -> None:
    keyed = letter(the_job=job(idempotency_key="welcome-ada"))
    out = replay_message(keyed, "ns", reset_attempts=True, priority=Priority.LOW)
    assert out.topic == "ns.jobs.low"
    assert out.key == b"welcome-ada"
    assert out.job is not None
    assert (out.job.attempt, out.job.priority) == (1, Priority.LOW)
    elsewhere = replay_message(keyed, "ns", priority="low", to_topic="ns.jobs.critical")
    assert elsewhere.topic == "ns.jobs.critical"


def test_replay_message_of_raw_bytes_is_byte_for_byte() -> None:
    raw = raw_letter()
    out = replay_message(raw, "ns", reset_attempts=True, priority="high")
    assert out.topic == "ns.jobs.low"  # where it came from; no job, so no priority
    assert (out.key, out.value, out.job) == (b"k1", b"\x00\x01not avro", None)
    assert out.headers == [("h", b"v"), ("empty", b"")]
    assert replay_message(raw, "ns", to_topic="ns.jobs.default").topic == "ns.jobs.default"
    # An empty topic asked for is not "no topic asked for": the producer refuses it, loudly.
    assert replay_message(raw, "ns", to_topic="").topic == ""
    assert replay_message(letter(), "ns", to_topic="").topic == ""


def test_a_letter_with_nothing_in_it_cannot_be_replayed() -> None:
    empty = DeadLetter(
        id="dl-empty", reason="poison_pill", message="?", source_topic="t", source_partition=0,
        source_offset=0,
    )  # fmt: skip
    with pytest.raises(PipelineError, match="nothing to replay"):
        replay_message(empty, "ns")


def test_the_transactional_id_is_one_per_namespace() -> None:
    assert dlq_transactional_id("acme.prod") == "acme.prod.dlq-cli"


# --- state ----------------------------------------------------------------------------------


def state(status: str, at: int, to: str | None = None) -> bytes:
    return LetterState(status=LetterStatus(status), at=at, by="ada@host", to=to).to_json()


def test_state_records_round_trip_as_json() -> None:
    replayed = LetterState(
        status=LetterStatus.REPLAYED, at=NOW, by="ada@host", to="ns.jobs.high", job_id="job-1"
    )
    data = replayed.to_json()
    assert b'"status":"replayed"' in data
    assert LetterState.from_json(data) == replayed
    discarded = LetterState(status=LetterStatus.DISCARDED, at=NOW, by="ada@host")
    assert b'"to"' not in discarded.to_json()
    assert LetterState.from_json(discarded.to_json()) == discarded


def test_fold_states_later_record_wins() -> None:
    states = fold_states(
        [
            ("a", state("replayed", 1, "ns.jobs.default")),
            ("b", state("discarded", 2)),
            ("a", state("discarded", 3)),
            ("c", state("replayed", 4)),
            ("c", None),  # tombstone: pending again
            ("d", state("discarded", 5)),
            ("d", state("pending", 6)),
            ("b", b"not json"),  # ignored: b stays discarded
            ("b", b'{"status": "lost", "at": 1}'),
            ("b", b'["replayed"]'),
            # Another writer's: this table's `to` and `job_id` are text, never a number or a list.
            ("b", b'{"status": "replayed", "at": 7, "by": "x", "to": 5}'),
            ("b", b'{"status": "replayed", "at": 8, "by": "x", "job_id": ["j"]}'),
            ("b", b"[" * 100_000 + b"]" * 100_000),  # deeper than the json module reads
            ("e", state("discarded", 9)),
            ("e", b'{"status": "pending"}'),  # by hand, as documented: pending again
        ]
    )
    assert set(states) == {"a", "b"}
    assert (states["a"].status, states["a"].at, states["a"].to) == (LetterStatus.DISCARDED, 3, None)
    assert states["b"].status is LetterStatus.DISCARDED


def stored(dead: DeadLetter, status: str | None = None, offset: int = 0) -> StoredLetter:
    the_state = None
    if status is not None:
        the_state = LetterState(status=LetterStatus(status), at=NOW, by="x")
    return StoredLetter(dead, 0, offset, the_state)


def test_actionable_skips_replayed_and_discarded_unless_forced() -> None:
    letters = [
        stored(letter("a")),
        stored(letter("b"), "replayed"),
        stored(letter("c"), "discarded"),
        stored(letter("d"), "replayed"),
    ]
    todo, skipped = actionable(letters)
    assert [s.letter.id for s in todo] == ["a"]
    assert skipped == Counter({LetterStatus.REPLAYED: 2, LetterStatus.DISCARDED: 1})
    todo, skipped = actionable(letters, force=True)
    assert [s.letter.id for s in todo] == ["a", "b", "c", "d"]
    assert not skipped


def test_actionable_with_states_read_again_forces_only_what_nobody_changed_since() -> None:
    letters = [stored(letter("a")), stored(letter("b"), "replayed"), stored(letter("c"))]
    again = LetterState(status=LetterStatus.REPLAYED, at=NOW + 1, by="someone else")
    replayed = letters[1].state
    assert replayed is not None
    now = {"b": replayed, "c": again}
    todo, skipped = actionable(letters, force=True, states=now)
    assert [(s.letter.id, s.state) for s in todo] == [("a", None), ("b", replayed)]
    assert skipped == Counter({LetterStatus.REPLAYED: 1})  # c: replayed by someone since
    todo, skipped = actionable(letters, states=now)
    assert [s.letter.id for s in todo] == ["a"]
    assert skipped == Counter({LetterStatus.REPLAYED: 2})


def test_snapshot_find_by_letter_id_or_unique_job_id() -> None:
    twice = job("job-2")
    snapshot = DeadLetterSnapshot(
        "ns.dlq",
        [
            stored(letter("dl-1")),
            stored(letter("dl-2", twice)),
            stored(letter("dl-3", twice)),
            stored(raw_letter()),
        ],
    )
    assert snapshot.find("dl-2").letter.id == "dl-2"
    assert snapshot.find("job-1").letter.id == "dl-1"
    with pytest.raises(DeadLetterNotFoundError, match="job job-2 has 2 dead letters"):
        snapshot.find("job-2")
    with pytest.raises(DeadLetterNotFoundError, match="no dead letter or job with id 'zzz'"):
        snapshot.find("zzz")
    assert [s.letter.id for s in snapshot.select(LetterFilter(reasons=("decode_error",)))] == [
        "dl-raw"
    ]


def test_stats_count_statuses_and_pending_reasons_and_types() -> None:
    snapshot = DeadLetterSnapshot(
        "ns.dlq",
        [
            stored(letter("a")),
            stored(letter("b", job("j2", "report.build"), reason="fatal_error")),
            stored(letter("c", job("j3", "report.build"), reason="fatal_error")),
            stored(letter("d"), "replayed"),
            stored(letter("e"), "discarded"),
            stored(raw_letter()),
        ],
        undecodable=2,
    )
    stats = dlq_stats(snapshot)
    assert stats.by_status == {"pending": 4, "replayed": 1, "discarded": 1}
    assert stats.depth == 4
    assert stats.pending_by_reason == {"fatal_error": 2, "decode_error": 1, "max_attempts": 1}
    assert list(stats.pending_by_reason) == ["fatal_error", "decode_error", "max_attempts"]
    assert stats.pending_by_type == {"report.build": 2, "(unknown)": 1, "email.send": 1}
    assert stats.undecodable == 2


def test_the_dead_letter_reader_fetches_again_soon_after_its_read_ahead_drains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka's default pause before fetching a partition whose read-ahead was full (1 s)
    made every `pipeline dlq` command a third slower."""
    confs: list[dict[str, object]] = []
    monkeypatch.setattr(_reader, "Consumer", confs.append)
    _reader._Reader(Settings(namespace="acme"), 5.0, prefetch_kb=1024)
    [conf] = confs
    assert conf["fetch.queue.backoff.ms"] <= 10  # type: ignore[operator]
    assert conf["queued.max.messages.kbytes"] == 1024


@pytest.mark.parametrize(
    "args",
    [
        ["dlq", "discard", "--error", "", "--yes"],  # it would have matched every letter
        ["dlq", "discard", "--id", " ", "--yes"],
        ["dlq", "ls", "--type", "email.send", "--type", ""],
        ["dlq", "replay", "--tenant", "", "--yes"],
        ["dlq", "replay", "--to-topic", "", "--yes"],  # it was taken as no topic at all
    ],
)
def test_an_empty_filter_or_topic_is_a_usage_error(args: list[str]) -> None:
    result = CliRunner().invoke(cli, [*args, "--bootstrap-servers", "127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "must not be empty" in result.output


def test_a_time_out_of_range_is_shown_as_its_number() -> None:
    # A producer that wrote microseconds where milliseconds belong: year 57971.
    assert when(1_767_225_600_000_000) == "1767225600000000 ms since the epoch (out of range)"
    assert when(NOW) == "2026-01-01T00:00:00Z"
