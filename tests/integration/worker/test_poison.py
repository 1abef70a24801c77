"""Poison pills against real Kafka: a job that kills its worker process every time it runs is
dead-lettered after ``poison_deliveries`` deaths, and the jobs behind it on its partition run.

The detection state lives in the commit metadata (see ``pipeline_worker._poison``), so it
survives the crashes it counts; the worker processes are restarted by ``--processes``
supervision, as they would be by an orchestrator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pipeline._deadletters import read_dead_letters
from pipeline._records import DeadLetter, DeadLetterReason

from .harness import enqueue, wait_until
from .scenarios import FAST_FAILOVER

if TYPE_CHECKING:
    from pipeline import Settings

    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

DELIVERIES = 2
KEY = "one-partition"


def _poison_letters(settings: Settings) -> list[DeadLetter]:
    return [
        stored.letter
        for stored in read_dead_letters(settings).letters
        if stored.letter.reason == DeadLetterReason.POISON_PILL
    ]


def test_a_job_that_kills_its_worker_every_time_is_dead_lettered_and_its_partition_moves_on(
    kit: WorkerKit,
) -> None:
    # One key: the 41 jobs are offsets 0..40 of one partition, the poison pill at 20.
    before = enqueue(kit.producer, "noop", 20, key=KEY)
    [poison] = enqueue(kit.producer, "poison", 1, first=20, key=KEY)
    after = enqueue(kit.producer, "noop", 20, first=21, key=KEY)
    # `--processes 1` runs the worker in the command's own process, unsupervised: two
    # supervised processes, so that whichever dies is restarted. A short session timeout lets
    # the group notice a dead member in 6 s.
    env = {**FAST_FAILOVER, "PIPELINE_WORKER__POISON_DELIVERIES": str(DELIVERIES)}
    supervisor = kit.workers.start("--processes", "2", "--concurrency", "8", env=env)

    letters: list[DeadLetter] = []

    def dead_lettered() -> bool:
        letters[:] = _poison_letters(kit.settings)
        return bool(letters)

    wait_until(
        dead_lettered,
        timeout=100,
        what=lambda: f"the poison pill in the DLQ; it ran {kit.recording.run_counts()[poison]}x",
        watch=[supervisor],
        interval=0.5,
    )
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=60, watch=[supervisor])

    [letter] = letters
    assert letter.job_id == poison
    assert letter.job is not None
    assert letter.job.type == "poison"
    assert (
        letter.message
        == f"killed its worker {DELIVERIES} times while running alone on its partition"
    )
    runs = kit.recording.starts("poison")
    assert {(run.topic, run.partition, run.offset) for run in runs} == {
        (letter.source_topic, letter.source_partition, letter.source_offset)
    }
    # 1. Among the others, unsuspected: the first worker dies before its first regular commit
    #    (commits come every second, the poison starts within milliseconds), so its successor
    #    suspects every offset from 0 to the end of the partition.
    # 2. Its successor tries the suspects 0..40 in growing windows (1, 2, 4, 8 jobs: concurrency
    #    8 caps them) and dies with the window 15..22.
    # 3. The next owners run that window one job at a time: 20 runs alone and kills its worker
    #    once per strike, DELIVERIES times; the owner after that dead-letters it unrun.
    assert len(runs) == 2 + DELIVERIES, [(run.pid, run.time_ns) for run in runs]
    assert len({run.pid for run in runs}) == len(runs)  # each run killed its process
    # Every other job ran to its end (those in quarantine more than once: at least once).
    assert set(kit.recording.run_counts()) == {*before, poison, *after}
    assert kit.recording.all_finished(before + after)

    log = supervisor.log()
    assert "quarantine over" in log
    assert "dead-lettering" in log
    # Not its exit code: a child still waiting to be restarted counts its last death (1).
    supervisor.terminate()
    supervisor.wait(timeout=60)
