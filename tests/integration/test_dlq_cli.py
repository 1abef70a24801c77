"""``pipeline dlq`` against a real Kafka: list, show, replay, discard and stats, and fencing."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from pipeline._admin import apply_topics
from pipeline._codec import DeadLetterCodec, EventCodec, JobCodec
from pipeline._deadletters import (
    LetterFilter,
    LetterStatus,
    discard_letters,
    dlq_depth,
    read_dead_letters,
    read_states,
    replay_letters,
)
from pipeline._errors import TransactionFencedError
from pipeline._job import AttemptError, Job, Priority, now_ms
from pipeline._records import DeadLetter
from pipeline._topics import TopicNames
from pipeline_cli._main import cli
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline._settings import Settings

HOUR = 3_600_000


@pytest.fixture
def topics(settings: Settings) -> Settings:
    apply_topics(settings)
    return settings


def dlq(settings: Settings, *args: str, code: int = 0, stdin: str | None = None) -> Result:
    common = [
        "--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace,
        "--timeout", "20",
    ]  # fmt: skip
    result = CliRunner().invoke(cli, ["dlq", *args, *common], input=stdin)
    assert result.exit_code == code, result.output
    return result


def dlq_json(settings: Settings, *args: str) -> list[dict[str, object]]:
    listed = json.loads(dlq(settings, *args, "--json").stdout)
    assert isinstance(listed, list)
    return listed


def ids(listed: Sequence[dict[str, object]]) -> list[object]:
    return [item["id"] for item in listed]


@dataclass(frozen=True)
class Message:
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def read_topic(settings: Settings, topic: str) -> list[Message]:
    """Every committed message of ``topic``: the commands return after their commit."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.test-reader",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 20,  # the end of a partition is seen one fetch after its data
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        todo = {}
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            if high > low:
                todo[p] = low
        consumer.assign([TopicPartition(topic, p, low) for p, low in todo.items()])
        out: list[Message] = []
        deadline = time.monotonic() + 10
        while todo:
            assert time.monotonic() < deadline, f"{topic} was not read to its end within 10 s"
            for m in consumer.consume(100, 0.05):
                error = m.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error.str()
                    todo.pop(m.partition() or 0, None)
                    continue
                headers = m.headers() or []
                assert isinstance(headers, list)
                pairs = [(k, v if isinstance(v, bytes) else b"") for k, v in headers]
                out.append(Message(m.key(), m.value() or b"", pairs))
        return out
    finally:
        consumer.close()


def end_offsets(settings: Settings, topics: Sequence[str]) -> dict[tuple[str, int], int]:
    consumer = Consumer(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": "unused-offset-reader"}
    )
    try:
        ends = {}
        for topic in topics:
            for p in consumer.list_topics(topic, timeout=10).topics[topic].partitions:
                ends[topic, p] = consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1]
        return ends
    finally:
        consumer.close()


def every_topic(settings: Settings) -> list[str]:
    names = TopicNames(settings.namespace)
    return [*names.all_jobs(), names.dlq_state, names.events]


# --- the dead letters of the tests ----------------------------------------------------------


def email_letter(settings: Settings, n: int, **job_fields: object) -> DeadLetter:
    dead_at = job_fields.pop("dead_at", now_ms() - 10 * 60_000)
    assert isinstance(dead_at, int)
    errors = [
        AttemptError(
            attempt=a, at=dead_at - (6 - a) * 1000, error_class="builtins.TimeoutError",
            message=f"smtp timed out (try {a})", retryable=True, worker="w-1",
        )
        for a in range(1, 6)
    ]  # fmt: skip
    job = Job(
        id=f"email-{n}",
        type="email.send",
        payload=json.dumps({"to": f"user{n}@example.com"}).encode(),
        attempt=5,
        max_attempts=5,
        errors=errors,
        headers={"traceparent": f"00-{n}"},
        **job_fields,  # type: ignore[arg-type]
    )
    return DeadLetter(
        reason="max_attempts",
        message="smtp timed out (try 5)",
        error_class="builtins.TimeoutError",
        source_topic=TopicNames(settings.namespace).jobs("default"),
        source_partition=0,
        source_offset=n,
        job=job,
        raw_key=f"key-{n}".encode(),
        dead_at=dead_at,
    )


def report_letter(settings: Settings, n: int) -> DeadLetter:
    job = Job(
        id=f"report-{n}",
        type="report.build",
        payload=b'{"day": "2026-01-01"}',
        priority=Priority.HIGH,
        max_attempts=3,
        errors=[
            AttemptError(
                attempt=1, at=now_ms(), error_class="builtins.ValueError",
                message="bad report layout", retryable=False,
            )
        ],
    )  # fmt: skip
    return DeadLetter(
        reason="fatal_error",
        message="bad report layout",
        error_class="builtins.ValueError",
        source_topic=TopicNames(settings.namespace).jobs("high"),
        source_partition=1,
        source_offset=n,
        job=job,
    )


def raw_letter(settings: Settings) -> DeadLetter:
    return DeadLetter(
        reason="decode_error",
        message="not a single-object encoded record",
        source_topic=TopicNames(settings.namespace).jobs("low"),
        source_partition=0,
        source_offset=3,
        raw_value=b"\x00\x01not avro",
        raw_key=b"raw-key",
        raw_headers={"trace": b"t1"},
    )


def write_letters(
    settings: Settings, letters: Sequence[DeadLetter], aborted: Sequence[DeadLetter] = ()
) -> None:
    """Commit ``letters`` in one transaction (as workers do) and abort ``aborted`` in another;
    also commit one record that is not a dead letter."""
    codec = DeadLetterCodec()
    topic = TopicNames(settings.namespace).dlq
    producer = Producer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "transactional.id": f"{settings.namespace}.test-writer",
        }
    )
    producer.init_transactions(10)
    producer.begin_transaction()
    for letter in letters:
        producer.produce(topic, codec.encode(letter), letter.job_id and letter.job_id.encode())
    producer.produce(topic, b"not a dead letter", b"junk")
    producer.commit_transaction(10)
    producer.begin_transaction()
    for letter in aborted:
        producer.produce(topic, codec.encode(letter))
    producer.flush(10)
    producer.abort_transaction(10)
    # A commit returns before its markers reach the partitions: until then a reader of
    # committed records stops short of them.
    written = {letter.id for letter in letters}
    assert wait_for(
        lambda: written <= {s.letter.id for s in read_dead_letters(settings).letters}, 30
    ), "the committed dead letters never became readable"


# --- tests ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Letters:
    """The dead letters of a test: three emails (one old, of tenant acme; one with an
    idempotency key), two reports, one undecodable message."""

    settings: Settings
    e1: DeadLetter
    e2: DeadLetter
    e3: DeadLetter
    r1: DeadLetter
    r2: DeadLetter
    raw: DeadLetter

    @property
    def emails(self) -> set[str]:
        return {self.e1.id, self.e2.id, self.e3.id}

    @property
    def all(self) -> set[str]:
        return self.emails | {self.r1.id, self.r2.id, self.raw.id}


@pytest.fixture
def letters(topics: Settings) -> Letters:
    s = topics
    written = Letters(
        s,
        email_letter(s, 1, tenant="acme", dead_at=now_ms() - 3 * 24 * HOUR),
        email_letter(s, 2),
        email_letter(s, 3, idempotency_key="welcome-3"),
        report_letter(s, 1),
        report_letter(s, 2),
        raw_letter(s),
    )
    w = written
    write_letters(s, [w.e1, w.e2, w.e3, w.r1, w.r2, w.raw], aborted=[email_letter(s, 9)])
    return written


def test_ls_lists_committed_dead_letters_oldest_first(letters: Letters) -> None:
    settings, e1, raw = letters.settings, letters.e1, letters.raw
    listed = dlq(settings, "ls")
    assert listed.stdout.splitlines()[0].split()[:4] == ["ID", "JOB", "ID", "TYPE"]
    rows = [row.split()[0] for row in listed.stdout.splitlines()[1:]]
    assert rows[0] == e1.id
    assert set(rows) == letters.all  # the aborted one and the junk record are left out
    assert "6 dead letters (0 replayed, 0 discarded hidden)" in listed.stderr
    assert "left out 1 record" in listed.stderr

    every = dlq_json(settings, "ls")
    assert ids(every)[0] == e1.id
    assert set(ids(every)) == letters.all
    first = every[0]
    assert (first["status"], first["reason"], first["tenant"]) == (
        "pending",
        "max_attempts",
        "acme",
    )
    job = first["job"]
    assert isinstance(job, dict)
    assert (job["payload"], job["payload_format"]) == ({"to": "user1@example.com"}, "json")
    assert [e["message"] for e in job["errors"]] == [
        f"smtp timed out (try {a})" for a in range(1, 6)
    ]
    by_id = {item["id"]: item for item in every}
    assert by_id[raw.id]["job"] is None
    assert base64.b64decode(str(by_id[raw.id]["raw_value"])) == b"\x00\x01not avro"
    assert ids(dlq_json(settings, "ls", "--limit", "2")) == ids(every)[:2]
    limited = dlq(settings, "ls", "--limit", "2", "--type", "email.send")
    assert "showing 2 of 3 dead letters" in limited.stderr


def test_filters_narrow_the_list(letters: Letters) -> None:
    settings, e1, e2, r1, r2 = letters.settings, letters.e1, letters.e2, letters.r1, letters.r2

    def listed(*args: str) -> set[object]:
        return set(ids(dlq_json(settings, "ls", *args)))

    assert listed("--type", "report.build") == {r1.id, r2.id}
    assert listed("--type", "email.*", "--type", "nope") == letters.emails
    assert listed("--reason", "decode_error") == {letters.raw.id}
    assert listed("--error", "VALUEERROR") == {r1.id, r2.id}
    assert listed("--error", "(try 3)") == letters.emails  # an earlier attempt's message
    assert listed("--since", "1d") == letters.all - {e1.id}
    assert listed("--until", "1d") == {e1.id}
    assert listed("--tenant", "acme") == {e1.id}
    assert listed("--id", "email-2", "--id", r1.id) == {e2.id, r1.id}
    assert listed("--type", "email.send", "--reason", "fatal_error") == set()


def test_a_read_for_some_letters_keeps_only_those(letters: Letters) -> None:
    """A bulk action (and a filtered `ls`, `replay` or `discard`) read every letter of
    ``<ns>.dlq`` into memory, then picked the few it acts on: a deep topic outgrew the
    dashboard's memory at each action."""
    settings, r1, r2 = letters.settings, letters.r1, letters.r2
    discard_letters(settings, [read_dead_letters(settings, timeout=20).find(r2.id)], timeout=20)
    reports = LetterFilter(types=("report.build",))
    snapshot = read_dead_letters(settings, timeout=20, only=reports.matches)
    assert [s.letter.id for s in snapshot.letters] == [r1.id, r2.id]
    assert [s.status for s in snapshot.letters] == [LetterStatus.PENDING, LetterStatus.DISCARDED]
    assert snapshot.undecodable == 1  # counted as before, whatever is kept
    listed = dlq_json(settings, "ls", "--all", "--type", "report.build")
    assert ids(listed) == [r1.id, r2.id]


def test_show_and_stats(letters: Letters) -> None:
    settings, e2, raw = letters.settings, letters.e2, letters.raw
    shown = dlq(settings, "show", "email-2").stdout  # a job id with one dead letter
    assert e2.id in shown
    assert "attempt          5 of 5" in shown
    assert '"to": "user2@example.com"' in shown
    history = shown[shown.index("attempts (5 failed):") :]
    positions = [history.index(f"smtp timed out (try {a})") for a in range(1, 6)]
    assert positions == sorted(positions)
    raw_shown = dlq(settings, "show", raw.id).stdout
    assert "raw value (10 bytes)" in raw_shown
    assert "00 01 6e 6f 74" in raw_shown
    assert "trace: t1" in raw_shown
    assert json.loads(dlq(settings, "show", letters.r1.id, "--json").stdout)["job_id"] == "report-1"
    missing = dlq(settings, "show", "no-such-id", code=1)
    assert "no dead letter or job with id 'no-such-id'" in missing.output

    stats = json.loads(dlq(settings, "stats", "--json").stdout)
    assert (stats["pending"], stats["replayed"], stats["depth"]) == (6, 0, 6)
    assert stats["pending_by_reason"] == {"max_attempts": 3, "fatal_error": 2, "decode_error": 1}
    assert stats["pending_by_type"] == {"email.send": 3, "report.build": 2, "(unknown)": 1}
    assert dlq_depth(settings) == 6


def test_replay_sends_the_jobs_back_once(letters: Letters) -> None:
    settings = letters.settings
    names = TopicNames(settings.namespace)

    # A dry run lists exactly what would be replayed and writes nothing.
    before = end_offsets(settings, every_topic(settings))
    dry = dlq(settings, "replay", "--type", "email.send", "--dry-run")
    assert {row.split()[0] for row in dry.stdout.splitlines()[1:]} == letters.emails
    assert f"would replay 3 dead letters to {names.jobs('default')}" in dry.stderr
    dry_json = json.loads(
        dlq(settings, "replay", "--type", "email.send", "--dry-run", "--json").stdout
    )
    assert {item["replay_to"] for item in dry_json} == {names.jobs("default")}
    assert end_offsets(settings, every_topic(settings)) == before

    # The same jobs, one attempt more, with their keys; state records and events with them.
    done = dlq(settings, "replay", "--type", "email.send", "--yes")
    assert f"replayed 3 dead letters to {names.jobs('default')}" in done.stdout
    sent = {
        job.id: (job, m.key)
        for m in read_topic(settings, names.jobs("default"))
        for job in [JobCodec().decode(m.value)]
    }
    assert set(sent) == {"email-1", "email-2", "email-3"}
    assert {job.attempt for job, _ in sent.values()} == {6}
    assert all(len(job.errors) == 5 and job.not_before is None for job, _ in sent.values())
    assert (sent["email-1"][1], sent["email-3"][1]) == (b"key-1", b"welcome-3")
    assert sent["email-2"][0].headers == {"traceparent": "00-2"}
    events = [EventCodec().decode(m.value) for m in read_topic(settings, names.events)]
    assert sorted(e.job_id for e in events if e.kind == "replayed") == [
        "email-1",
        "email-2",
        "email-3",
    ]
    states = read_states(settings)
    assert {k: s.status for k, s in states.items()} == dict.fromkeys(
        letters.emails, LetterStatus.REPLAYED
    )
    assert states[letters.e1.id].to == names.jobs("default")

    # Twice: nothing more. --force: again.
    before = end_offsets(settings, every_topic(settings))
    again = dlq(settings, "replay", "--type", "email.send", "--yes")
    assert "nothing to replay (3 already replayed, skipped)" in again.stdout
    assert end_offsets(settings, every_topic(settings)) == before
    forced = json.loads(
        dlq(settings, "replay", "--type", "email.send", "--force", "--yes", "--json").stdout
    )
    assert sorted(item["job_id"] for item in forced["replayed"]) == [
        "email-1",
        "email-2",
        "email-3",
    ]
    assert len(read_topic(settings, names.jobs("default"))) == 6


def test_replay_options_raw_bytes_and_discard(letters: Letters) -> None:
    settings, r1, r2, raw = letters.settings, letters.r1, letters.r2, letters.raw
    names = TopicNames(settings.namespace)

    # A priority override with reset attempts; raw bytes go back where they came from, as is.
    dlq(settings, "replay", "--id", r1.id, "--priority", "critical", "--reset-attempts", "--yes")
    [critical] = read_topic(settings, names.jobs("critical"))
    report = JobCodec().decode(critical.value)
    assert (report.id, report.attempt, report.priority) == ("report-1", 1, Priority.CRITICAL)
    dlq(settings, "replay", "--reason", "decode_error", "--yes")
    [back] = read_topic(settings, names.jobs("low"))
    assert (back.key, back.value, back.headers) == (
        b"raw-key",
        b"\x00\x01not avro",
        [("trace", b"t1")],
    )

    # Discard asks first and skips what was replayed; discarded letters leave `ls`.
    declined = dlq(settings, "discard", "--type", "report.build", stdin="n\n", code=1)
    assert "Discard 1 dead letter?" in declined.output
    assert read_states(settings).get(r2.id) is None
    confirmed = dlq(settings, "discard", "--type", "report.build", stdin="y\n")
    assert "discarded 1 dead letter (1 already replayed, skipped)" in confirmed.output
    assert ids(dlq_json(settings, "ls")) == [letters.e1.id, letters.e2.id, letters.e3.id]
    assert "3 dead letters (2 replayed, 1 discarded hidden)" in dlq(settings, "ls").stderr
    statuses = {item["id"]: item["status"] for item in dlq_json(settings, "ls", "--all")}
    assert (statuses[r2.id], statuses[r1.id], statuses[raw.id]) == (
        "discarded",
        "replayed",
        "replayed",
    )
    events = [EventCodec().decode(m.value) for m in read_topic(settings, names.events)]
    assert [e.job_id for e in events if e.kind == "discarded"] == ["report-2"]
    skipped = dlq(settings, "replay", "--type", "report.build", "--yes")
    assert "nothing to replay (1 already replayed, 1 discarded, skipped)" in skipped.stdout
    assert "0 pending" not in dlq(settings, "stats").stdout
    stats = json.loads(dlq(settings, "stats", "--json").stdout)
    assert (stats["pending"], stats["replayed"], stats["discarded"]) == (3, 2, 1)


def test_a_second_command_fences_the_first(topics: Settings) -> None:
    settings = topics.model_copy(update={"events": "off"})
    names = TopicNames(settings.namespace)
    letters = [email_letter(settings, n) for n in (1, 2, 3)]
    write_letters(settings, letters)
    snapshot = read_dead_letters(settings, timeout=20)
    a, b, c = (snapshot.find(letter.id) for letter in letters)
    calls: list[int] = []

    def concurrent_discard(done: int) -> None:
        calls.append(done)
        if len(calls) == 1:  # after the replay's first transaction: another command starts
            # Its letters are as read before the replay began: `a` looks pending.
            report = discard_letters(settings, [a, b, c], timeout=20)
            assert {s.letter.id for s in report.done} == {b.letter.id, c.letter.id}
            assert report.skipped == {LetterStatus.REPLAYED: 1}  # `a`, seen after fencing

    with pytest.raises(TransactionFencedError, match="another `pipeline dlq replay` or `discard`"):
        replay_letters(settings, [a, b], batch_size=1, timeout=20, on_progress=concurrent_discard)
    assert calls == [1]
    states = read_states(settings, timeout=20)
    assert {k: s.status.value for k, s in states.items()} == {
        a.letter.id: "replayed",
        b.letter.id: "discarded",
        c.letter.id: "discarded",
    }
    assert [JobCodec().decode(m.value).id for m in read_topic(settings, names.jobs("default"))] == [
        "email-1"
    ]
    assert read_topic(settings, names.events) == []  # events are off
    pending = read_dead_letters(settings).select(LetterFilter(types=("email.send",)))
    assert [s.status for s in pending] == [LetterStatus.REPLAYED, *[LetterStatus.DISCARDED] * 2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ls", "--since", "yesterdayish"], "'yesterdayish' is neither an ISO-8601 datetime"),
        (["ls", "--since", "1h", "--until", "2h"], "--since must be before --until"),
        (["discard", "--yes"], "give at least one filter"),
        (["replay", "--priority", "urgent"], "'urgent' is not one of"),
        (["ls", "--limit", "0"], "0 is not in the range x>=1"),
    ],
)
def test_bad_arguments_are_refused_with_a_reason(
    settings: Settings, args: list[str], message: str
) -> None:
    result = dlq(settings, *args, code=2)
    assert message in result.output


def test_missing_topics_and_unreachable_kafka(settings: Settings) -> None:
    missing = dlq(settings, "ls", code=1)
    assert f"topic {settings.namespace}.dlq does not exist" in missing.output
    assert "pipeline topics apply" in missing.output
    result = CliRunner().invoke(
        cli, ["dlq", "stats", "--bootstrap-servers", "127.0.0.1:1", "--timeout", "1"]
    )
    assert result.exit_code == 1, result.output
    assert "Kafka at 127.0.0.1:1 did not answer within 1s" in result.output


@pytest.mark.parametrize("topic", ["dlq", "dlq_state", "events", "schedules"])
def test_replay_refuses_a_topic_of_the_namespace_that_holds_no_jobs(
    letters: Letters, topic: str
) -> None:
    """`--to-topic NS.dlq` wrote the jobs where no worker reads them and marked their dead
    letters replayed: they left `ls` and a second replay skipped them."""
    settings = letters.settings
    target = getattr(TopicNames(settings.namespace), topic)
    before = end_offsets(settings, [*every_topic(settings), target])
    refused = dlq(settings, "replay", "--type", "email.send", "--to-topic", target, "--yes", code=2)
    assert f"{target} holds no jobs" in refused.output
    assert end_offsets(settings, [*every_topic(settings), target]) == before
    assert set(ids(dlq_json(settings, "ls"))) == letters.all


def test_replay_to_a_missing_topic_says_which_option_and_that_nothing_was_written(
    letters: Letters,
) -> None:
    settings = letters.settings
    before = end_offsets(settings, every_topic(settings))
    failed = dlq(settings, "replay", "--to-topic", "no.such.topic", "--yes", code=1)
    assert "topic no.such.topic (--to-topic) does not exist; nothing was written" in failed.output
    assert "pipeline topics apply" not in failed.output  # it would not create that topic
    assert end_offsets(settings, every_topic(settings)) == before
    assert set(ids(dlq_json(settings, "ls"))) == letters.all


def test_a_letter_with_nothing_to_send_is_left_and_the_others_are_replayed(
    topics: Settings,
) -> None:
    # A message too large to keep whole: its letter holds neither the job nor the raw bytes.
    settings = topics
    empty = DeadLetter(
        reason="too_large",
        message="1,010,000-byte value left out",
        source_topic=TopicNames(settings.namespace).deferred,
        source_partition=0,
        source_offset=7,
        raw_key=b"big",
    )
    sent = email_letter(settings, 1)
    write_letters(settings, [empty, sent])

    preview = dlq(settings, "replay", "--dry-run")
    assert "would replay 1 dead letter to " in preview.stderr
    one = "1 holds neither a job nor the raw message, so nothing to replay: discard it"
    assert one in preview.stderr
    going = {item["id"]: item["replay_to"] for item in dlq_json(settings, "replay", "--dry-run")}
    assert going == {sent.id: TopicNames(settings.namespace).jobs("default"), empty.id: None}
    declined = dlq(settings, "replay", stdin="n\n", code=1)
    assert f"Replay 1 dead letter to {TopicNames(settings.namespace).jobs('default')} ({one})?" in (
        declined.output
    )
    replayed = json.loads(dlq(settings, "replay", "--yes", "--json").stdout)
    assert [item["id"] for item in replayed["replayed"]] == [sent.id]
    assert (replayed["skipped"], replayed["nothing_to_replay"]) == ({}, [empty.id])
    [job] = read_topic(settings, TopicNames(settings.namespace).jobs("default"))
    assert JobCodec().decode(job.value).id == sent.job_id
    statuses = {item["id"]: item["status"] for item in dlq_json(settings, "ls", "--all")}
    assert statuses == {empty.id: "pending", sent.id: "replayed"}

    again = dlq(settings, "replay", "--id", empty.id, "--yes")
    assert f"nothing to replay; {one}" in again.stdout
    dlq(settings, "discard", "--id", empty.id, "--yes")
    assert dlq_json(settings, "ls") == []
    # Discarded, it is one more letter --force skips, not one to tell to discard.
    forced = dlq(settings, "replay", "--id", empty.id, "--force", "--dry-run")
    assert "would replay 0 dead letters (1 discarded, skipped); dry run" in forced.stderr
