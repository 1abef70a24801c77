"""Poison pills against real Kafka: a job that kills its worker process every time it runs is
dead-lettered after ``poison_deliveries`` deaths, and the jobs behind it on its partition run.

The detection state lives in the commit metadata (see ``pipeline_worker.recovery.poison``), so it
survives the crashes it counts; the worker processes are restarted by ``--processes``
supervision, as they would be by an orchestrator.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka import Producer

from pipeline import Job, JobCodec, Priority
from pipeline._deadletters import read_dead_letters
from pipeline._records import DeadLetter, DeadLetterReason
from tests.waiting import wait_for

from .harness import WorkerProcess, enqueue, wait_until
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


def _produce(kit: WorkerKit, jobs: list[tuple[int, str, dict[str, Any]]]) -> list[str]:
    """Write ``(partition, type, payload)`` jobs to chosen partitions of the default topic."""
    producer = Producer(kit.settings.client_config())
    codec = JobCodec()
    ids = []
    for partition, job_type, payload in jobs:
        job = Job(id=uuid.uuid4().hex, type=job_type, payload=json.dumps(payload).encode())
        producer.produce(kit.topics.jobs(Priority.DEFAULT), codec.encode(job), partition=partition)
        ids.append(job.id)
    assert producer.flush(30) == 0
    return ids


def _drained(kit: WorkerKit) -> bool:
    return not kit.offsets.lag(kit.topics.all_jobs())


@pytest.mark.slow
def test_a_job_on_another_partition_is_not_struck_by_a_poison_pill_that_ran_beside_it(
    kit: WorkerKit,
) -> None:
    # One worker process owns both partitions: a 3 s job that succeeds on one, a job that
    # kills its process after 0.5 s on the other, each followed by a job that does nothing.
    innocent, after_innocent, poison, after_poison = _produce(
        kit,
        [
            (0, "long", {"n": 0, "seconds": 3.0}),
            (0, "noop", {"n": 1}),
            (1, "poison", {"n": 2, "after_s": 0.5}),
            (1, "noop", {"n": 3}),
        ],
    )
    env = {**FAST_FAILOVER, "PIPELINE_WORKER__POISON_DELIVERIES": str(DELIVERIES)}
    # Restarted by the test, as an orchestrator would: each worker is the group's only live
    # member, so the next owner of one partition is the next owner of both.
    workers: list[WorkerProcess] = []
    letters: list[DeadLetter] = []

    def settled() -> bool:
        letters[:] = [stored.letter for stored in read_dead_letters(kit.settings).letters]
        return any(letter.job_id == poison for letter in letters) and _drained(kit)

    while not settled():
        assert len(workers) < 2 * (2 + DELIVERIES), (
            f"{len(workers)} workers died; runs: {kit.recording.run_counts()}\n"
            + workers[-1].log_tail()
        )
        worker = kit.workers.start("--concurrency", "8", env=env)
        workers.append(worker)
        ended = wait_for(lambda: not worker.alive() or settled(), 90, interval=0.5)  # noqa: B023
        assert ended, worker.log_tail()
    workers[-1].terminate()
    workers[-1].wait(timeout=60)

    assert [(letter.job_id, letter.reason) for letter in letters] == [
        (poison, DeadLetterReason.POISON_PILL)
    ]
    assert kit.recording.all_finished([innocent, after_innocent, after_poison])
    # Each death was the poison pill's own: once with its neighbour, then once alone per strike.
    assert len(kit.recording.starts("poison")) == 1 + DELIVERIES
    assert len([w for w in workers if w.returncode not in (0, None)]) == 1 + DELIVERIES


@pytest.mark.slow
def test_two_poison_pills_on_two_partitions_are_both_dead_lettered_and_the_rest_runs(
    kit: WorkerKit,
) -> None:
    jobs: list[tuple[int, str, dict[str, Any]]] = []
    for partition in range(2):
        jobs += [(partition, "noop", {"n": 10 * partition + i}) for i in range(3)]
        jobs.append((partition, "poison", {"n": 10 * partition + 3}))
        jobs += [(partition, "noop", {"n": 10 * partition + i}) for i in range(4, 8)]
    jobs += [(partition, "noop", {"n": 100 + partition}) for partition in range(2, 6)]
    ids = _produce(kit, jobs)
    poisons = {i for i, (_, job_type, _) in zip(ids, jobs, strict=True) if job_type == "poison"}
    others = [i for i in ids if i not in poisons]
    env = {**FAST_FAILOVER, "PIPELINE_WORKER__POISON_DELIVERIES": str(DELIVERIES)}
    supervisor = kit.workers.start("--processes", "2", "--concurrency", "8", env=env)

    letters: list[DeadLetter] = []

    def both_dead_lettered() -> bool:
        letters[:] = _poison_letters(kit.settings)
        return len(letters) >= len(poisons)

    wait_until(
        both_dead_lettered,
        timeout=240,
        what=lambda: f"both poison pills in the DLQ; runs: {kit.recording.run_counts()}",
        watch=[supervisor],
        interval=0.5,
    )
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=90, watch=[supervisor])

    assert {letter.job_id for letter in letters} == poisons
    assert len(letters) == len(poisons)
    assert kit.recording.all_finished(others)
    every = [stored.letter for stored in read_dead_letters(kit.settings).letters]
    assert {letter.job_id for letter in every} == poisons  # no innocent job was dead-lettered
    supervisor.terminate()
    supervisor.wait(timeout=60)
