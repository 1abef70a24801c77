"""Long versions of the worker's fault tests: bigger counts, repeated kills, minutes of churn."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

import pytest

from pipeline import Priority
from tests.integration.worker.harness import (
    CommitAuditor,
    WorkerProcess,
    auditing,
    check_ran,
    enqueue,
    wait_joined,
    wait_until,
)
from tests.integration.worker.scenarios import (
    FAST_FAILOVER,
    JobStream,
    Kill,
    after,
    check_kills,
    kill_worker,
    max_overlap,
    run_churn,
)

if TYPE_CHECKING:
    from tests.integration.worker.fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_100000_jobs_over_4_priorities_run_once(kit: WorkerKit) -> None:
    ids: list[str] = []
    for index, priority in enumerate(Priority):
        job_type = "sleepy" if index % 2 == 0 else "sleepy_async"
        ids += enqueue(
            kit.producer,
            job_type,
            25_000,
            first=index * 25_000,
            fields={"max_ms": 5.0},
            priority=priority,
        )
    job_topics = kit.topics.all_jobs()
    with auditing(CommitAuditor(kit.offsets, kit.recording, job_topics), 0.5) as auditor:
        worker = kit.workers.start("--concurrency", "200", "--burst")
        code = worker.wait(timeout=1200)
    assert code == 0, worker.log_tail()
    assert check_ran(kit.recording, ids, exactly_once=True) == []
    assert kit.offsets.lag(job_topics) == {}
    auditor.assert_clean()
    assert max_overlap(kit.recording.events) <= 200


def test_repeated_sigkills_lose_nothing_and_repeat_only_uncommitted_jobs(kit: WorkerKit) -> None:
    topic = kit.topics.jobs(Priority.DEFAULT)
    recording = kit.recording
    ids = enqueue(
        kit.producer,
        "sleepy_async",
        50_000,
        fields={"min_ms": 5.0, "max_ms": 30.0},
        priority="default",
    )
    kills: list[Kill] = []
    args = ["--concurrency", "200"]
    with auditing(
        CommitAuditor(
            kit.offsets,
            recording,
            [topic],
        ),
        0.2,
    ) as auditor:
        for round_ in range(1, 6):
            worker = kit.workers.start(*args, env=FAST_FAILOVER)
            target = round_ * 7000
            committed_before = sum(kit.offsets.committed([topic]).values())

            def mid_run(target: int = target, before: int = committed_before) -> bool:
                # Each worker is killed after it committed something, mid-stream.
                return (
                    recording.count("S") >= target
                    and sum(kit.offsets.committed([topic]).values()) > before
                )

            wait_until(mid_run, timeout=300, what=f"{target} job starts", watch=[worker])
            kills.append(kill_worker(worker, kit.offsets, recording, [topic]))
        last = kit.workers.start(*args, "--burst", env=FAST_FAILOVER)
        assert last.wait(timeout=900) == 0, last.log_tail()

    assert check_ran(recording, ids, exactly_once=False) == []
    report = check_kills(recording, kills)
    assert report.problems == [], "\n".join(report.problems[:20])
    assert all(kill.in_flight for kill in kills), "a kill hit a worker with nothing running"
    assert kit.offsets.lag([topic]) == {}
    auditor.assert_clean()
    print(
        f"{len(kills)} kills: handlers running {report.in_flight}, taken but uncommitted "
        f"{report.uncommitted}, ran again {report.reruns}"
    )


def test_minutes_of_churn_lose_and_repeat_nothing(kit: WorkerKit) -> None:
    job_topics = kit.topics.all_jobs()
    with auditing(CommitAuditor(kit.offsets, kit.recording, job_topics), 0.2) as auditor:
        result = run_churn(
            kit,
            jobs=60_000,
            rate=330,
            phases=[(2, 60.0), (3, 60.0), (2, 60.0)],
            period=3.0,
            worker_args=["--concurrency", "20"],
            fields={"min_ms": 5.0, "max_ms": 20.0},
        )
    assert set(result.exit_codes) == {0}, result.exit_codes
    assert result.joins >= 20, result
    assert check_ran(kit.recording, result.ids, exactly_once=True) == []
    assert kit.offsets.lag(job_topics) == {}
    auditor.assert_clean()


def test_workers_killed_and_stopped_at_random_during_a_stream(kit: WorkerKit) -> None:
    """Three workers; every few seconds one is SIGKILLed or SIGTERMed and replaced."""
    topic = kit.topics.jobs(Priority.DEFAULT)
    recording = kit.recording
    rng = random.Random(7)
    args = ["--concurrency", "50"]
    stream = JobStream(
        kit.settings,
        "sleepy_async",
        rate=300,
        total=30_000,
        fields={"min_ms": 5.0, "max_ms": 40.0},
        priority="default",
    )
    kills: list[Kill] = []
    codes: list[int] = []
    running: list[WorkerProcess] = []
    with auditing(CommitAuditor(kit.offsets, recording, [topic]), 0.2) as auditor:
        stream.start()
        try:
            running = [kit.workers.start(*args, env=FAST_FAILOVER) for _ in range(3)]
            wait_joined(kit.settings, kit.offsets.group, running, stable=False)
            while len(stream.ids) < 30_000:
                wait_until(
                    after(4.0, recording),
                    timeout=180,
                    what="jobs to make progress between two faults",
                    watch=running,
                )
                victim = running.pop(rng.randrange(len(running)))
                if rng.random() < 0.5:
                    kills.append(kill_worker(victim, kit.offsets, recording, [topic]))
                else:
                    victim.terminate()
                    codes.append(victim.wait(timeout=90))
                running.append(kit.workers.start(*args, env=FAST_FAILOVER))
                wait_joined(kit.settings, kit.offsets.group, running[-1:], stable=False)
            ids = stream.stop()
            wait_until(
                lambda: recording.all_finished(ids),
                timeout=600,
                what=lambda: f"all jobs to finish ({len(recording.finished_ids)} so far)",
                watch=running,
                interval=0.5,
            )
        finally:
            stream.cancel()
        for worker in running:
            worker.terminate()
        codes.extend(worker.wait(timeout=90) for worker in running)

    assert set(codes) == {0}, codes
    assert kills, "the random schedule killed nobody"
    assert check_ran(recording, ids, exactly_once=False) == []
    # Only killed workers' uncommitted jobs may run twice: graceful stops hand over without
    # repeats (check_kills flags any other repeat).
    report = check_kills(recording, kills)
    assert report.problems == [], "\n".join(report.problems[:20])
    assert kit.offsets.lag([topic]) == {}
    auditor.assert_clean()
