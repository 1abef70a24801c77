"""After a SIGKILL only the unfinished jobs run again: a long job at the head of a partition does
not make the short jobs that finished behind it run a second time, whether the worker dies
while it runs alone or in the middle of a rebalance."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pipeline_worker.commit.marks import CommitMark

from .harness import enqueue, wait_for, wait_until
from .harness.gates import Gates
from .harness.metrics import free_port, scrape, total
from .scenarios import FAST_FAILOVER

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from .fixtures import WorkerKit
    from .harness import WorkerProcess

pytestmark = pytest.mark.kafka

SHORT_JOBS = 3000
SKIPPED = "pipeline_finished_skipped_total"


@pytest.fixture
def gates() -> Iterator[Gates]:
    opened = Gates()
    yield opened
    opened.close()


def test_a_sigkill_behind_a_long_job_reruns_the_long_job_and_not_the_short_ones(
    kit: WorkerKit, gates: Gates
) -> None:
    def kill(first: WorkerProcess) -> Watched:
        first.kill()
        return start_watched(kit)

    run_behind_a_long_job(kit, gates, kill)


@pytest.mark.slow
def test_a_sigkill_during_a_rebalance_behind_a_long_job_reruns_none_of_the_short_ones(
    kit: WorkerKit, gates: Gates
) -> None:
    def kill_while_rebalancing(first: WorkerProcess) -> Watched:
        second, port = start_watched(kit)
        # The first worker gives partitions up to the one that joins (the revocation waits
        # for a running job, the long one, up to the grace period): it dies in the middle.
        wait_until(
            lambda: "partitions revoked" in first.log(),
            timeout=60,
            what="the first worker to give partitions up to the second",
            watch=[first, second],
        )
        first.kill()
        return second, port

    run_behind_a_long_job(kit, gates, kill_while_rebalancing)


Watched = tuple["WorkerProcess", int]
"""A worker and its metrics port."""


def start_watched(kit: WorkerKit) -> Watched:
    port = free_port()
    worker = kit.workers.start(
        "--concurrency", "16", "--metrics-port", str(port), env=FAST_FAILOVER
    )
    return worker, port


def run_behind_a_long_job(
    kit: WorkerKit, gates: Gates, kill: Callable[[WorkerProcess], Watched]
) -> None:
    """A long job, then ``SHORT_JOBS`` short ones on its partition; once the short ones are
    finished and committed as such, ``kill`` SIGKILLs the worker and returns the one that
    goes on; the long job is let end once it runs again. Only the long job runs twice."""
    recording = kit.recording
    # One key: the long job and the short ones behind it share a partition, the long job first.
    long_id = kit.producer.enqueue(
        "gate", {"n": 0, "port": gates.port}, priority="default", key="one-partition"
    )
    short = enqueue(
        kit.producer, "noop", SHORT_JOBS, first=1, priority="default", key="one-partition"
    )
    first = kit.workers.start("--concurrency", "16", env=FAST_FAILOVER)
    wait_until(
        lambda: recording.all_finished(short),
        timeout=60,
        what=lambda: f"the short jobs to finish ({len(recording.finished_ids)} jobs ended)",
        watch=[first],
    )
    [started] = recording.starts("gate")
    assert recording.unfinished() == {long_id}, "the long job still runs"
    offsets = {e.job_id: e.offset for e in recording.starts("noop")}

    def listed() -> set[str]:
        """The short jobs the last commit lists as finished."""
        offset, metadata = kit.offsets.metadata(started.topic, started.partition)
        skipped = {o for s, e in CommitMark.decode(offset, metadata).skips for o in range(s, e)}
        return {job for job, o in offsets.items() if o < offset or o in skipped}

    # A commit follows within an interval; whatever the commits say when the worker dies must
    # not run again.
    everything_listed = wait_for(lambda: listed() == set(short), 30)
    committed_before_kill = listed()
    survivor, port = kill(first)
    gates.wait_held(2, timeout_s=60)  # the first run's connection, then the second run's
    assert len(recording.starts("gate")) == 2, "the long job runs again"
    gates.release()
    wait_until(
        lambda: recording.all_finished([long_id]),
        timeout=30,
        what="the long job to end",
        watch=[survivor],
    )
    kit.offsets.wait_drained([started.topic], timeout=60, watch=[survivor])
    runs = recording.run_counts()
    again = sorted(
        (job for job in committed_before_kill if runs[job] > 1), key=lambda job: offsets[job]
    )
    assert again == [], (
        f"{len(again)} of the {len(committed_before_kill)} short jobs committed as finished "
        f"before the kill ran again (every one listed by then: {everything_listed}), "
        f"first offsets {[offsets[job] for job in again[:5]]}"
    )
    twice = [job for job in short if runs[job] != 1]
    assert twice == [], f"{len(twice)} of {SHORT_JOBS} short jobs did not run exactly once"
    assert everything_listed, "a commit listing every finished short job came within 30 s"
    assert runs[long_id] == 2, "the long job, unfinished at the kill, runs again"
    samples = scrape(port)
    assert samples is not None, survivor.log_tail()
    assert total(samples, SKIPPED) == SHORT_JOBS
