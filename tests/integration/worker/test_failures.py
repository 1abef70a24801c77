"""Failure routing against real Kafka: retries through the tiers, dead letters, bad messages.

Each test runs real ``pipeline-worker`` processes on the recording app, whose ``flaky``,
``doomed`` and ``poison`` job types fail on purpose, with retry tiers of 0.5 s and 2 s.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from pipeline import Job, JobCodec, Priority, Settings
from pipeline._deadletters import read_dead_letters
from pipeline._records import DeadLetter, DeadLetterReason
from pipeline_cli._main import cli
from tests.waiting import wait_for

from .fixtures import with_retry_tiers
from .harness import GroupOffsets, enqueue

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

RETRY_DELAYS = [0.5, 2.0]
WORKER_ENV = {"PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS)}
TOLERANCE_S = 1.5
"""How much later than its backoff a retry may start: the relay's transaction, two fetches."""


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return with_retry_tiers(bootstrap_servers, namespace, RETRY_DELAYS)


def _letters(settings: Settings) -> list[DeadLetter]:
    return [stored.letter for stored in read_dead_letters(settings).letters]


def test_a_job_failing_twice_runs_three_times_after_its_backoff_and_keeps_its_priority(
    kit: WorkerKit,
) -> None:
    [job_id] = enqueue(kit.producer, "flaky", 1, fields={"failures": 2}, priority="high")
    kit.workers.start("--concurrency", "4", env=WORKER_ENV)

    assert wait_for(lambda: kit.recording.all_finished([job_id]), 60), "never succeeded"
    runs = [e for e in kit.recording.events if e.job_id == job_id]
    assert [e.kind for e in runs] == ["S", "F", "S", "F", "S", "E"]
    assert {e.topic for e in runs} == {kit.topics.jobs(Priority.HIGH)}
    # FAST_BACKOFF: 0.5 s after the first failure, 1 s after the second.
    for failed, retried, backoff in ((runs[1], runs[2], 0.5), (runs[3], runs[4], 1.0)):
        waited = (retried.time_ns - failed.time_ns) / 1e9
        assert backoff <= waited <= backoff + TOLERANCE_S, (backoff, waited)
    assert _letters(kit.settings) == []


def test_an_always_failing_job_is_dead_lettered_after_max_attempts_with_its_history(
    kit: WorkerKit,
) -> None:
    [transient] = enqueue(kit.producer, "doomed", 1, max_attempts=3)
    [fatal] = enqueue(kit.producer, "doomed", 1, first=1, fields={"fatal": True}, max_attempts=3)
    kit.workers.start("--concurrency", "4", env=WORKER_ENV)

    assert wait_for(lambda: len(_letters(kit.settings)) == 2, 60), kit.workers.started[0].log_tail()
    letters = {letter.job_id: letter for letter in _letters(kit.settings)}
    runs = kit.recording.run_counts()
    assert runs[transient] == 3
    assert runs[fatal] == 1

    dead = letters[transient]
    assert dead.reason == DeadLetterReason.MAX_ATTEMPTS
    assert dead.error_class == "builtins.ValueError"
    assert dead.source_topic == kit.topics.jobs(Priority.DEFAULT)
    assert dead.job is not None
    history = dead.job.errors
    assert [e.attempt for e in history] == [1, 2, 3]
    assert [e.message for e in history] == [f"attempt {i} of job 0 fails" for i in (1, 2, 3)]
    assert all(e.retryable and e.worker and e.traceback_digest for e in history)
    assert len({e.traceback_digest for e in history}) == 1  # the same failure each time

    fatal_letter = letters[fatal]
    assert fatal_letter.reason == DeadLetterReason.FATAL_ERROR
    assert (fatal_letter.error_class or "").endswith("recording.UnrecoverableError")
    assert fatal_letter.job is not None
    assert [(e.attempt, e.retryable) for e in fatal_letter.job.errors] == [(1, False)]

    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=30)
    relay = GroupOffsets(kit.settings, f"{kit.settings.namespace}.workers.retry")
    try:
        relay.wait_drained([kit.topics.retry(i) for i in range(len(RETRY_DELAYS))], timeout=30)
    finally:
        relay.close()


def _dlq(settings: Settings, *args: str) -> str:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    result = CliRunner().invoke(cli, ["dlq", *args, *common])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_dead_letters_replayed_from_the_cli_run_once_and_discarded_ones_disappear(
    kit: WorkerKit,
) -> None:
    # flaky fails its first 3 attempts; with max_attempts=3 it is dead-lettered, and the replay
    # (one more attempt: the 4th) succeeds. doomed always fails: one attempt, then the DLQ.
    flaky = enqueue(kit.producer, "flaky", 3, fields={"failures": 3}, max_attempts=3)
    doomed = enqueue(kit.producer, "doomed", 2, first=10, max_attempts=1)
    kit.workers.start("--concurrency", "8", env=WORKER_ENV)
    assert wait_for(lambda: len(_letters(kit.settings)) == 5, 60)
    assert kit.recording.run_counts() == dict.fromkeys(flaky, 3) | dict.fromkeys(doomed, 1)

    dry = json.loads(_dlq(kit.settings, "replay", "--type", "flaky", "--dry-run", "--json"))
    assert sorted(row["job_id"] for row in dry) == sorted(flaky)
    assert kit.recording.run_counts() == dict.fromkeys(flaky, 3) | dict.fromkeys(doomed, 1)

    _dlq(kit.settings, "replay", "--type", "flaky", "--yes")
    assert wait_for(lambda: kit.recording.all_finished(flaky), 60), "replayed jobs never ran"
    jobs_topic = kit.topics.jobs(Priority.DEFAULT)
    ends = kit.offsets.ends([jobs_topic])
    again = _dlq(kit.settings, "replay", "--type", "flaky", "--yes", "--json")
    assert json.loads(again)["replayed"] == []
    assert kit.offsets.ends([jobs_topic]) == ends, "a second replay wrote jobs again"
    kit.offsets.wait_drained([jobs_topic], timeout=30)
    assert kit.recording.run_counts() == dict.fromkeys(flaky, 4) | dict.fromkeys(doomed, 1)

    _dlq(kit.settings, "discard", "--type", "doomed", "--yes")
    shown = json.loads(_dlq(kit.settings, "ls", "--json"))
    assert shown == [], "replayed and discarded letters are hidden by default"
    everything = json.loads(_dlq(kit.settings, "ls", "--all", "--json"))
    statuses = sorted((row["job_id"], row["status"]) for row in everything)
    assert statuses == sorted([(i, "replayed") for i in flaky] + [(i, "discarded") for i in doomed])


def test_a_type_s_declared_max_attempts_holds_for_a_job_whose_producer_did_not_know_it(
    kit: WorkerKit,
) -> None:
    # A producer without the app (another language, the CLI without --app) writes the
    # envelope's default max_attempts (5); the type "twice" declares 2.
    job = Job(id=uuid.uuid4().hex, type="twice", payload=b'{"n": 1}')
    assert job.max_attempts == 5
    producer = Producer(kit.settings.client_config())
    producer.produce(kit.topics.jobs(Priority.DEFAULT), JobCodec().encode(job))
    assert producer.flush(30) == 0
    kit.workers.start("--concurrency", "4", env=WORKER_ENV)

    assert wait_for(lambda: len(_letters(kit.settings)) == 1, 60), kit.recording.run_counts()
    [letter] = _letters(kit.settings)
    assert (letter.job_id, letter.reason) == (job.id, DeadLetterReason.MAX_ATTEMPTS)
    assert letter.job is not None
    assert [error.attempt for error in letter.job.errors] == [1, 2]
    assert kit.recording.run_counts() == {job.id: 2}


def test_a_dead_letter_keeps_the_tail_of_its_traceback_and_dlq_show_prints_it(
    kit: WorkerKit,
) -> None:
    [short] = enqueue(kit.producer, "doomed", 1, max_attempts=1)
    [long] = enqueue(kit.producer, "loud", 1, first=1, max_attempts=1)
    kit.workers.start("--concurrency", "4", env=WORKER_ENV)
    assert wait_for(lambda: len(_letters(kit.settings)) == 2, 60), kit.recording.run_counts()
    letters = {letter.job_id: letter for letter in _letters(kit.settings)}

    text = letters[short].traceback
    assert text is not None
    assert text.startswith("Traceback (most recent call last):\n")
    assert ", in doomed\n" in text
    assert text.endswith("ValueError: attempt 1 of job 0 fails\n")

    cut = letters[long].traceback
    assert cut is not None
    assert len(cut.encode()) == 8192  # bounded: the last 8 KB, after a mark that it was cut
    assert cut.startswith("...\n")
    assert cut.endswith("x" * 100 + " END\n")  # the tail: where the error is

    shown = _dlq(kit.settings, "show", short)
    assert "traceback (last error):\n  Traceback (most recent call last):\n" in shown
    assert "  ValueError: attempt 1 of job 0 fails\n" in shown
    as_json = json.loads(_dlq(kit.settings, "show", long, "--json"))
    assert as_json["traceback"] == cut


def test_a_failed_job_near_the_message_size_limit_moves_without_stopping_the_worker(
    kit: WorkerKit,
) -> None:
    """A job enqueued just under the producers' 1,000,000 bytes grows past them with its attempt
    history: its move was refused, which stopped the worker at every attempt. Now the retry
    keeps a shorter history, and what cannot be retried or dead-lettered whole is dead-lettered
    smaller (route/fit.py)."""
    [retried] = enqueue(kit.producer, "padded", 1, fields={"pad": "p" * 990_000})
    [too_large] = enqueue(kit.producer, "padded", 1, first=1, fields={"pad": "p" * 999_700})
    [small] = enqueue(kit.producer, "flaky", 1, first=2, fields={"failures": 1})
    worker = kit.workers.start("--concurrency", "4", env=WORKER_ENV)

    assert wait_for(lambda: len(_letters(kit.settings)) == 2, 60), worker.log_tail()
    assert wait_for(lambda: kit.recording.all_finished([small]), 60), worker.log_tail()
    assert worker.alive(), "the worker stopped"
    runs = kit.recording.run_counts()
    assert (runs[retried], runs[too_large]) == (2, 1)
    letters = {letter.job_id: letter for letter in _letters(kit.settings)}
    kept = letters[retried]
    assert kept.reason == DeadLetterReason.MAX_ATTEMPTS
    assert kept.job is not None
    assert len(kept.job.payload) > 990_000
    left_out = next(letter for letter in letters.values() if letter.job_id != retried)
    assert left_out.reason == DeadLetterReason.TOO_LARGE
    assert left_out.job is None
    assert "message.max.bytes 1000000" in left_out.message
