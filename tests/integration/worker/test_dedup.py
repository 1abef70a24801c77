"""Idempotency keys: duplicates from several producers run once, also across worker crashes."""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections import Counter
from typing import TYPE_CHECKING

from tests.waiting import wait_for

from .failure_kills import ENV as RETRY_ENV
from .failure_kills import settings as retry_settings
from .harness import enqueue, wait_joined
from .scenarios import FAST_FAILOVER

if TYPE_CHECKING:
    from .fixtures import WorkerKit
    from .harness import WorkerProcess
    from .harness.runs import RunEvent

settings = retry_settings  # retry tiers of 0.5 s and 2 s

KEYS = 2000
COPIES = 5
PRODUCERS = 3

# One producer process: enqueues copy c of key i when (i * COPIES + c) % PRODUCERS is its number.
PRODUCER = """
import sys
from pipeline import Pipeline

number, producers, keys, copies = map(int, sys.argv[1:])
app = Pipeline()
for copy in range(copies):
    for i in range(keys):
        if (i * copies + copy) % producers == number:
            app.enqueue("sleepy", {"n": i, "max_ms": 2.0}, idempotency_key=f"order-{i}")
app.flush(60)
app.close(30)
"""


def _produce(kit: WorkerKit) -> None:
    """Three producer processes send every key COPIES times, interleaved."""
    env = kit.workers.environment()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PRODUCER, str(n), str(PRODUCERS), str(KEYS), str(COPIES)],
            env=env,
        )
        for n in range(PRODUCERS)
    ]
    for process in processes:
        assert process.wait(120) == 0, "a producer failed"


def _runs_by_key(kit: WorkerKit) -> Counter[int]:
    return Counter(e.n for e in kit.recording.starts("sleepy"))


def _keys_ran(kit: WorkerKit, keys: int) -> bool:
    return len(_runs_by_key(kit)) >= keys


def test_10000_jobs_with_2000_keys_from_3_producers_run_2000_times(kit: WorkerKit) -> None:
    worker = kit.workers.start("--concurrency", "32")
    wait_joined(kit.settings, kit.offsets.group, [worker], stable=False)
    _produce(kit)
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=120)
    runs = _runs_by_key(kit)
    assert sorted(runs) == list(range(KEYS)), "a key never ran"
    assert [n for n, count in runs.items() if count > 1] == []
    assert sum(runs.values()) == KEYS


def test_keys_survive_two_sigkills_and_a_takeover(kit: WorkerKit) -> None:
    """A second worker takes over the partitions of one killed twice: a key whose job was
    committed never runs again; only jobs not committed at a kill may run twice."""
    env = {**FAST_FAILOVER, "PIPELINE_WORKER__COMMIT_INTERVAL_S": "0.2"}
    workers: list[WorkerProcess] = [
        kit.workers.start("--concurrency", "16", env=env) for _ in range(2)
    ]
    wait_joined(kit.settings, kit.offsets.group, workers, stable=False)
    _produce(kit)
    kills: list[tuple[int, int]] = []  # (pid, time of the kill)
    for target in (KEYS // 3, 2 * KEYS // 3):
        assert wait_for(functools.partial(_keys_ran, kit, target), 120), "no progress"
        victim = workers[0]
        victim.kill()
        kills.append((victim.pid, _now_ns()))
        workers[0] = kit.workers.start("--concurrency", "16", env=env)
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=180)
    starts = kit.recording.starts("sleepy")
    runs = Counter(e.n for e in starts)
    assert sorted(runs) == list(range(KEYS)), "a key never ran"
    again = {n for n, count in runs.items() if count > 1}
    # Every repeat is of a key whose first run was on a killed worker, shortly before its kill:
    # in flight, or finished but not committed yet (commits every 0.2 s).
    first: dict[int, RunEvent] = {}
    for event in sorted(starts, key=lambda e: e.time_ns):
        first.setdefault(event.n, event)
    killed_at = dict(kills)
    for n in again:
        run = first[n]
        assert run.pid in killed_at, f"key {n} ran twice but its first worker was not killed"
        assert killed_at[run.pid] - run.time_ns < 5_000_000_000, f"key {n} was old at the kill"
    in_flight_bound = sum(16 + _started_within(starts, pid, at, 1.0) for pid, at in kills)
    assert len(again) <= in_flight_bound
    print(f"{len(again)} keys ran twice; bound {in_flight_bound}")


def _started_within(starts: list[RunEvent], pid: int, at_ns: int, seconds: float) -> int:
    """Runs that worker ``pid`` started in the ``seconds`` before ``at_ns``."""
    return sum(1 for e in starts if e.pid == pid and 0 <= at_ns - e.time_ns <= seconds * 1e9)


def _now_ns() -> int:
    return time.time_ns()


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
