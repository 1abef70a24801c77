"""A crashed worker loses nothing and repeats only uncommitted jobs; a stopped one finishes."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import pytest

from pipeline import Priority

from .harness import CommitAuditor, TopicPartitionKey, auditing, check_ran, enqueue, wait_until
from .scenarios import FAST_FAILOVER, check_kills, kill_worker

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_sigkill_mid_run_then_restart_runs_every_job_and_repeats_only_uncommitted_ones(
    kit: WorkerKit,
) -> None:
    topic = kit.topics.jobs(Priority.DEFAULT)
    ids = enqueue(
        kit.producer,
        "sleepy_async",
        10_000,
        fields={"min_ms": 10.0, "max_ms": 50.0},
        priority="default",
    )
    recording = kit.recording
    with auditing(CommitAuditor(kit.offsets, recording, [topic])) as auditor:
        first = kit.workers.start("--concurrency", "100", env=FAST_FAILOVER)

        def mid_run() -> bool:
            # Kill once commits are under way (so "committed" means something) and while most
            # jobs are still to come.
            return (
                recording.count("S") >= 4000
                and sum(kit.offsets.committed([topic]).values()) >= 1000
            )

        wait_until(
            mid_run,
            timeout=120,
            what=lambda: f"4000 starts and 1000 commits ({recording.count('S')} started)",
            watch=[first],
        )
        kill = kill_worker(first, kit.offsets, recording, [topic])
        second = kit.workers.start("--concurrency", "100", "--burst", env=FAST_FAILOVER)
        code = second.wait(timeout=240)

    assert code == 0, second.log_tail()
    assert check_ran(recording, ids, exactly_once=False) == []
    report = check_kills(recording, [kill])
    # Only jobs the killed worker had taken and not committed may run again, and the jobs whose
    # handlers it was running must: that bounds the repeats by the jobs in flight at the kill.
    assert report.problems == [], "\n".join(report.problems[:20])
    assert report.reruns <= report.uncommitted
    assert kill.in_flight, "no job was running at the kill: the test proved nothing"
    assert len(kill.in_flight) <= 100, "more handlers ran at once than --concurrency allows"
    assert sum(kill.committed.values()) >= 1000
    assert kill.finished < len(ids), "the first worker finished everything before the kill"
    assert max(recording.run_counts().values()) <= 2
    assert kit.offsets.lag([topic]) == {}
    auditor.assert_clean()
    print(
        f"killed pid {kill.pid} after {kill.finished} finished jobs; handlers running: "
        f"{len(kill.in_flight)}, taken but uncommitted: {report.uncommitted}, "
        f"ran twice: {report.reruns}"
    )


def test_sigterm_finishes_in_flight_jobs_commits_and_exits_0(kit: WorkerKit) -> None:
    topic = kit.topics.jobs(Priority.DEFAULT)
    recording = kit.recording
    ids = enqueue(
        kit.producer,
        "sleepy_async",
        1000,
        fields={"min_ms": 100.0, "max_ms": 300.0},
        priority="default",
    )
    worker = kit.workers.start("--concurrency", "50")
    wait_until(
        lambda: recording.count("S") >= 150, timeout=60, what="150 job starts", watch=[worker]
    )
    running_at_signal = recording.unfinished(pid=worker.pid)
    worker.terminate()
    assert worker.wait(timeout=60) == 0, worker.log_tail()

    assert running_at_signal, "no job was running at SIGTERM: the test proved nothing"
    assert recording.unfinished(pid=worker.pid) == set(), "jobs were cut off by SIGTERM"
    # Stopped cleanly, the worker finished a prefix of each partition and committed exactly it.
    committed = kit.offsets.committed([topic])
    finished: dict[TopicPartitionKey, set[int]] = defaultdict(set)
    for event in recording.ends():
        finished[event.tp].add(event.offset)
    for tp, offset in committed.items():
        done = sorted(finished[tp])
        assert done == list(range(offset)), f"{tp}: committed {offset}, finished {done}"
    assert sum(committed.values()) == len(recording.finished_ids) > 0

    restarted = kit.workers.start("--concurrency", "50", "--burst")
    assert restarted.wait(timeout=120) == 0, restarted.log_tail()
    assert check_ran(recording, ids, exactly_once=True) == []
    assert kit.offsets.lag([topic]) == {}
