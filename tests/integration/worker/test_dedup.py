"""Idempotency keys: duplicates from several producers run once, also across worker crashes."""

from __future__ import annotations

import subprocess
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import AdminClient

from pipeline._deadletters import _Reader
from tests.waiting import wait_for

from ..scheduler.conftest import SchedulerFactory
from .failure_kills import ENV as RETRY_ENV
from .failure_kills import settings as retry_settings
from .harness import enqueue, wait_joined
from .keyed_producers import (
    assert_reruns_were_uncommitted,
    kill_one_running,
    runs_by_key,
    start_producers,
)

if TYPE_CHECKING:
    from .fixtures import WorkerKit
    from .harness import WorkerProcess
    from .harness.runs import TopicPartitionKey

settings = retry_settings  # retry tiers of 0.5 s and 2 s

KEYS = 2000
COPIES = 5
PRODUCERS = 3


def _start_producers(kit: WorkerKit, max_ms: float) -> list[subprocess.Popen[bytes]]:
    """Three producer processes send every key COPIES times, interleaved."""
    return start_producers(kit, producers=PRODUCERS, keys=KEYS, copies=COPIES, max_ms=max_ms)


def _produce(kit: WorkerKit, max_ms: float = 2.0) -> None:
    for process in _start_producers(kit, max_ms):
        assert process.wait(120) == 0, "a producer failed"


def test_10000_jobs_with_2000_keys_from_3_producers_run_2000_times(kit: WorkerKit) -> None:
    worker = kit.workers.start("--concurrency", "32", env=RETRY_ENV)
    wait_joined(kit.settings, kit.offsets.group, [worker], stable=False)
    _produce(kit)
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=120)
    runs = runs_by_key(kit)
    assert sorted(runs) == list(range(KEYS)), "a key never ran"
    assert [n for n, count in runs.items() if count > 1] == []
    assert sum(runs.values()) == KEYS


@pytest.mark.slow
def test_keys_survive_two_sigkills_and_a_takeover(kit: WorkerKit) -> None:
    """A second worker takes over the partitions of one killed twice: no key runs again once
    its job was committed, and the keys that run twice are at most the jobs in flight (started,
    not committed) at the kills."""
    env = {**RETRY_ENV, "PIPELINE_WORKER__COMMIT_INTERVAL_S": "0.2"}
    args = ("--concurrency", "16", "--priorities", "default")  # both own partitions of it
    workers: list[WorkerProcess] = [kit.workers.start(*args, env=env) for _ in range(2)]
    wait_joined(kit.settings, kit.offsets.group, workers, stable=False)
    producers = _start_producers(kit, max_ms=30.0)  # jobs of 15-30 ms: many in flight
    # A killed worker commits nothing more: what is committed right after its kill is all it
    # ever committed.
    committed_at_kill: dict[int, dict[TopicPartitionKey, int]] = {}
    for target in (KEYS // 3, 2 * KEYS // 3):
        victim = kill_one_running(kit, workers, target)
        committed_at_kill[victim.pid] = kit.offsets.committed(kit.topics.all_jobs())
        workers[workers.index(victim)] = kit.workers.start(*args, env=env)
    for process in producers:
        assert process.wait(120) == 0, "a producer failed"
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=180)
    assert_reruns_were_uncommitted(kit, KEYS, committed_at_kill)


def test_a_retried_job_keeps_its_key_and_a_duplicate_after_success_is_dropped(
    kit: WorkerKit,
) -> None:
    """The retry of a keyed job is the same job: it runs. A duplicate sent while the original
    waits in a retry tier, and one sent after it succeeded, never run."""
    [original] = enqueue(
        kit.producer, "flaky", 1, fields={"failures": 1}, idempotency_key="invoice-7"
    )
    kit.workers.start("--concurrency", "4", env=RETRY_ENV)
    assert wait_for(lambda: kit.recording.count("F", "flaky") == 1, 60), "never failed"
    [waiting] = enqueue(
        kit.producer, "flaky", 1, first=1, fields={"failures": 0}, idempotency_key="invoice-7"
    )
    assert wait_for(lambda: kit.recording.all_finished([original]), 60), "never retried"
    [late] = enqueue(
        kit.producer, "flaky", 1, first=2, fields={"failures": 0}, idempotency_key="invoice-7"
    )
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=60)
    runs = kit.recording.run_counts()
    assert runs[original] == 2
    assert runs[waiting] == 0
    assert runs[late] == 0


def test_a_missing_changelog_topic_stops_the_worker_with_what_to_create(kit: WorkerKit) -> None:
    admin = AdminClient({"bootstrap.servers": kit.settings.bootstrap_servers})
    admin.delete_topics([kit.topics.dedup])[kit.topics.dedup].result(30)
    assert wait_for(lambda: kit.topics.dedup not in admin.list_topics(timeout=10).topics, 30), (
        "the changelog topic was not deleted"
    )
    worker = kit.workers.start(env=RETRY_ENV)
    assert worker.wait(60) != 0
    assert kit.topics.dedup in worker.log()
    assert "pipeline topics apply" in worker.log()


def test_a_key_expires_after_its_ttl_with_a_tombstone_and_then_runs_again(
    kit: WorkerKit,
) -> None:
    """``brief`` holds its key for 3 s after it succeeded: a duplicate within that time is
    dropped; once the worker tombstoned the key, the same key runs again."""
    kit.workers.start("--concurrency", "4", env=RETRY_ENV)
    [first] = enqueue(kit.producer, "brief", 1, idempotency_key="k-1")
    assert wait_for(lambda: kit.recording.all_finished([first]), 60), "never ran"
    [dropped] = enqueue(kit.producer, "brief", 1, first=1, idempotency_key="k-1")
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=60)
    assert wait_for(lambda: _tombstoned(kit, b"*/k-1"), 60), "the key never expired"
    [again] = enqueue(kit.producer, "brief", 1, first=2, idempotency_key="k-1")
    assert wait_for(lambda: kit.recording.all_finished([again]), 60), "an expired key still held"
    runs = kit.recording.run_counts()
    assert (runs[first], runs[dropped], runs[again]) == (1, 0, 1)


def _tombstoned(kit: WorkerKit, key: bytes) -> bool:
    """Whether the changelog's last committed record of ``key`` is a tombstone."""
    topic = kit.topics.dedup
    with _Reader(kit.settings, timeout=10) as reader:
        records = [m for m in reader.read(topic)[topic] if m.key() == key]
    return bool(records) and records[-1].value() is None


def test_a_delayed_job_keeps_its_key_through_the_scheduler(
    kit: WorkerKit, schedulers: SchedulerFactory
) -> None:
    """A delayed keyed job released by the scheduler lands on its key's partition and holds the
    key there: a duplicate sent after it ran is dropped."""
    scheduler = schedulers.start(RETRY_ENV)
    schedulers.wait_leading(scheduler)
    kit.workers.start("--concurrency", "4", env=RETRY_ENV)
    fields = {"failures": 0}
    [delayed] = enqueue(kit.producer, "flaky", 1, fields=fields, idempotency_key="d-1", delay=1.0)
    assert wait_for(lambda: kit.recording.all_finished([delayed]), 60), "never released or run"
    [duplicate] = enqueue(kit.producer, "flaky", 1, first=1, fields=fields, idempotency_key="d-1")
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=60)
    runs = kit.recording.run_counts()
    assert (runs[delayed], runs[duplicate]) == (1, 0)
