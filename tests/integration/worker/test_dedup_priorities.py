"""One idempotency key runs once across every priority topic (``worker.dedup_scope`` namespace):
enqueued 50 times over four priorities by three producers, also through a worker's SIGKILL."""

from __future__ import annotations

import subprocess
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from pipeline import Priority

from .harness import wait_joined
from .keyed_producers import assert_reruns_were_uncommitted, kill_one_running, start_producers

if TYPE_CHECKING:
    from .fixtures import WorkerKit
    from .harness import WorkerProcess

KEYS = 200
COPIES = 50
PRODUCERS = 3


def _start_producers(kit: WorkerKit, max_ms: float) -> list[subprocess.Popen[bytes]]:
    """Three producer processes send every key COPIES times, each at every priority."""
    return start_producers(
        kit, producers=PRODUCERS, keys=KEYS, copies=COPIES, max_ms=max_ms, rotate=True
    )


def test_one_key_enqueued_50_times_over_four_priorities_by_three_producers_runs_once(
    kit: WorkerKit,
) -> None:
    worker = kit.workers.start("--concurrency", "32")
    wait_joined(kit.settings, kit.offsets.group, [worker], stable=False)
    for process in _start_producers(kit, max_ms=2.0):
        assert process.wait(120) == 0, "a producer failed"
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=120)
    starts = kit.recording.starts("sleepy")
    runs = Counter(e.n for e in starts)
    assert sorted(runs) == list(range(KEYS)), "a key never ran"
    assert [n for n, count in runs.items() if count > 1] == [], "a key ran twice"
    written = Counter[str]()
    for (topic, _), end in kit.offsets.ends(kit.topics.all_jobs()).items():
        written[topic.rpartition(".")[2]] += end
    sent = Counter(list(Priority)[c % 4].value for c in range(COPIES) for _ in range(KEYS))
    assert written == sent, "the copies did not land on their priorities"


@pytest.mark.slow
def test_a_sigkill_runs_again_only_the_keys_whose_jobs_it_left_uncommitted(
    kit: WorkerKit,
) -> None:
    """Two workers own every priority's partitions; one is SIGKILLed mid-stream and replaced.
    A key runs twice only if its first run was not committed at the kill."""
    args = ("--concurrency", "16")
    env = {"PIPELINE_WORKER__COMMIT_INTERVAL_S": "0.2"}
    workers: list[WorkerProcess] = [kit.workers.start(*args, env=env) for _ in range(2)]
    wait_joined(kit.settings, kit.offsets.group, workers, stable=False)
    # Jobs of 200-400 ms: the 200 keys' first copies (the first 200 messages) take about two
    # seconds to run on the two workers, so the kill lands while many run.
    producers = _start_producers(kit, max_ms=400.0)
    victim = kill_one_running(kit, workers, KEYS // 2)
    committed_at_kill = {victim.pid: kit.offsets.committed(kit.topics.all_jobs())}
    workers[workers.index(victim)] = kit.workers.start(*args, env=env)
    for process in producers:
        assert process.wait(120) == 0, "a producer failed"
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=180)
    assert_reruns_were_uncommitted(kit, KEYS, committed_at_kill)
