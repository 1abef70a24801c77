"""A job far longer than max.poll.interval.ms: no rebalance, runs once, its partition moves on."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from pipeline import Priority

from .harness import check_ran, describe_group, enqueue, wait_for, wait_until
from .harness.metrics import free_port, scrape, total

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MAX_POLL_INTERVAL_MS = 6000  # the broker's minimum session timeout, and librdkafka wants >= it
LONG_JOB_S = 3 * MAX_POLL_INTERVAL_MS / 1000
REBALANCES = "pipeline_rebalances_total"


def test_job_running_3x_max_poll_interval_causes_no_rebalance_and_runs_once(
    kit: WorkerKit,
) -> None:
    recording = kit.recording
    # One key: the long job and the jobs behind it share a partition.
    long_id = kit.producer.enqueue(
        "long", {"n": 0, "seconds": LONG_JOB_S}, priority="default", key="one-partition"
    )
    behind = enqueue(kit.producer, "noop", 50, first=1, priority="default", key="one-partition")
    env = {
        "PIPELINE_WORKER__MAX_POLL_INTERVAL_MS": str(MAX_POLL_INTERVAL_MS),
        "PIPELINE_WORKER__SESSION_TIMEOUT_MS": str(MAX_POLL_INTERVAL_MS),
    }
    port = free_port()
    # No --burst: a burst worker exits the moment the long job ends, before the last scrape.
    worker = kit.workers.start("--concurrency", "4", "--metrics-port", str(port), env=env)
    wait_until(
        lambda: recording.count("S", job_type="long") >= 1,
        timeout=60,
        what="the long job to start",
        watch=[worker],
    )
    before = scrape(port)
    assert before is not None, f"no /metrics on port {port}\n{worker.log_tail()}"

    def long_job_ended() -> bool:
        return recording.count("E", job_type="long") > 0

    # Watch the group from the coordinator's side while the long job runs: a member that misses
    # max.poll.interval.ms is removed and comes back under a new member id.
    snapshots = [describe_group(kit.settings, kit.offsets.group)]
    deadline = time.monotonic() + LONG_JOB_S + 60
    while not wait_for(long_job_ended, timeout=1.0):
        assert worker.alive(), worker.log_tail()
        assert time.monotonic() < deadline, "the long job never ended"
        snapshots.append(describe_group(kit.settings, kit.offsets.group))
    wait_until(
        lambda: recording.count("E", job_type="noop") >= len(behind),
        timeout=60,
        what="the jobs behind the long one to finish",
        watch=[worker],
    )
    after = scrape(port)
    worker.terminate()  # graceful: commits what finished, then leaves the group
    assert worker.wait(timeout=60) == 0, worker.log_tail()

    assert after is not None, worker.log_tail()
    rebalances = total(after, REBALANCES) - total(before, REBALANCES)
    assert rebalances == 0, f"{rebalances} assignment changes while the long job ran"
    assert len(snapshots) >= 10, f"only {len(snapshots)} snapshots taken during the long job"
    assert all(s.stable for s in snapshots), f"group states seen: {[s.state for s in snapshots]}"
    members = {frozenset(s.members) for s in snapshots}
    assert len(members) == 1, f"membership changed while the long job ran: {members}"
    assert snapshots[0].clients == {worker.client_id}, snapshots[0]
    log = worker.log().lower()
    assert "max.poll.interval" not in log, worker.log_tail()
    assert "maximum poll interval" not in log, worker.log_tail()

    # The long job held one pool thread; the jobs behind it needed the pool to grow.
    assert 2 <= total(after, "pipeline_worker_threads") <= 4, worker.log_tail()
    assert check_ran(recording, [long_id, *behind], exactly_once=True) == []
    assert len({e.tp for e in recording.starts()}) == 1, "the jobs were meant to share a partition"
    long_end = next(e.time_ns for e in recording.ends("long"))
    assert all(e.time_ns < long_end for e in recording.ends("noop")), (
        "the jobs behind the long one waited for it: no concurrency within the partition"
    )
    assert kit.offsets.lag([kit.topics.jobs(Priority.DEFAULT)]) == {}
