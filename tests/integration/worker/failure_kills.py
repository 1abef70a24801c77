"""Failing jobs moving through the retry tiers while workers are SIGKILLed.

Moves are Kafka transactions with the consumed offsets, so a kill may make a handler run again
but never makes a move twice: every job should end exactly once, succeeded or in the DLQ.
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline._deadletters import read_dead_letters
from tests.waiting import wait_for

from .harness import GroupOffsets, describe_group, enqueue, wait_joined
from .scenarios import FAST_FAILOVER

if TYPE_CHECKING:
    from .fixtures import WorkerKit
    from .harness import WorkerProcess

MAX_ATTEMPTS = 3
ENV = {**FAST_FAILOVER, "PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps([0.5, 2.0])}


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap_servers,
        namespace=namespace,
        topics={"partitions": 3, "retry_delays_s": [0.5, 2.0]},
    )


def run_failing_jobs_through_kills(kit: WorkerKit, *, jobs: int, kills: int, seed: int = 5) -> None:
    """Enqueue ``jobs`` flaky jobs (0-4 failures each), SIGKILL one of two workers ``kills``
    times, evenly spread over the runs the jobs need, and check how every job ended."""
    rng = random.Random(seed)
    counts = Counter(rng.randint(0, 4) for _ in range(jobs))
    expected_dead: set[str] = set()
    expected_ok: set[str] = set()
    first = 0
    for failures, count in sorted(counts.items()):
        ids = enqueue(
            kit.producer, "flaky", count, first=first, fields={"failures": failures},
            max_attempts=MAX_ATTEMPTS,
        )  # fmt: skip
        first += count
        (expected_dead if failures >= MAX_ATTEMPTS else expected_ok).update(ids)
    workers: list[WorkerProcess] = [
        kit.workers.start("--concurrency", "32", env=ENV) for _ in range(2)
    ]
    wait_joined(kit.settings, kit.offsets.group, workers, stable=False)
    # Every job runs about 1 + min(failures, MAX_ATTEMPTS - 1) times: kill at even steps of that.
    runs = sum(count * (1 + min(f, MAX_ATTEMPTS - 1)) for f, count in counts.items())
    for round_ in range(kills):
        target = runs * (round_ + 1) // (kills + 1)
        if not wait_for(functools.partial(_started_at_least, kit, target), 120):
            pytest.fail(
                f"no progress: {kit.recording.count('S')} of {target} runs started; lag of the "
                f"jobs topics {kit.offsets.lag(kit.topics.all_jobs())}"
            )
        workers[round_ % 2].kill()
        workers[round_ % 2] = kit.workers.start("--concurrency", "32", env=ENV)

    def settled() -> bool:
        letters = _dead_job_ids(kit.settings)
        return set(letters) >= expected_dead and kit.recording.all_finished(expected_ok)

    if not wait_for(settled, 180):
        dead = set(_dead_job_ids(kit.settings))
        kit.recording.refresh()
        ok = kit.recording.finished_ids
        relay = GroupOffsets(kit.settings, f"{kit.offsets.group}.retry")
        tiers = [kit.topics.retry(0), kit.topics.retry(1)]
        try:
            stuck = relay.lag(tiers)
        finally:
            relay.close()
        pytest.fail(
            f"not every job ended: {len(expected_dead - dead)} of {len(expected_dead)} never "
            f"dead-lettered, {len(expected_ok - ok)} of {len(expected_ok)} never succeeded; "
            f"lag of the jobs topics {kit.offsets.lag(kit.topics.all_jobs())}, of the retry "
            f"tiers {stuck}, members of the relay group "
            f"{describe_group(kit.settings, f'{kit.offsets.group}.retry')}"
        )
    kit.offsets.wait_drained(kit.topics.all_jobs(), timeout=60)
    letters = Counter(_dead_job_ids(kit.settings))
    assert set(letters) == expected_dead, "a job that succeeded was dead-lettered"
    assert [j for j, n in letters.items() if n > 1] == [], "a job was dead-lettered twice"
    succeeded = kit.recording.finished_ids & (expected_ok | expected_dead)
    assert succeeded == expected_ok
    assert not succeeded & expected_dead


def _started_at_least(kit: WorkerKit, runs: int) -> bool:
    return kit.recording.count("S") >= runs


def _dead_job_ids(settings: Settings) -> list[str]:
    return [s.letter.job_id or "?" for s in read_dead_letters(settings).letters]
