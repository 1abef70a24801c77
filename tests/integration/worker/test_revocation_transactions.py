"""A revocation that waits for its jobs commits the moves' transaction before Kafka times it out.

While a revoked partition's jobs finish (up to ``revoke_grace_s``), the consumer thread waits
in the rebalance callback, and writes the moves of the jobs that fail meanwhile into the open
transaction. Kafka aborts a transaction older than ``transaction_timeout_ms`` and fences its
producer for good: the worker would stop at its next commit. Here a worker whose transactions
time out after 3 s waits on a revocation for longer, with a job failing early in the wait.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline._deadletters import read_dead_letters
from pipeline.testing._partitioner import partition_for

from .harness import wait_until
from .harness.gates import Gates

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

PARTITIONS = 2
ENV = {
    "PIPELINE_WORKER__TRANSACTION_TIMEOUT_MS": "3000",
    "PIPELINE_WORKER__REVOKE_GRACE_S": "60",
}


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap_servers,
        namespace=namespace,
        topics={"partitions": PARTITIONS},
    )


@pytest.fixture
def gates() -> Iterator[tuple[Gates, Gates]]:
    failing, holding = Gates(), Gates()
    try:
        yield failing, holding
    finally:
        failing.close()
        holding.close()


def keys_of(partition: int, count: int) -> list[bytes]:
    """``count`` keys that Kafka's partitioner puts on ``partition``."""
    candidates = (f"key-{i}".encode() for i in itertools.count())
    return list(
        itertools.islice(
            (k for k in candidates if partition_for(k, PARTITIONS) == partition), count
        )
    )


def test_a_revocation_waiting_long_commits_its_moves_before_kafka_times_them_out(
    kit: WorkerKit, gates: tuple[Gates, Gates]
) -> None:
    failing, holding = gates
    failed = []
    for partition in range(PARTITIONS):
        fails_key, holds_key = keys_of(partition, 2)
        payload = {"n": partition, "port": failing.port}
        failed.append(kit.producer.enqueue("gate_fail", payload, key=fails_key))
        payload = {"n": 10 + partition, "port": holding.port}
        kit.producer.enqueue("gate", payload, key=holds_key)
    kit.producer.flush(60)

    first = kit.workers.start("--priorities", "default", env=ENV)
    failing.wait_held(PARTITIONS, timeout_s=60)
    holding.wait_held(PARTITIONS, timeout_s=60)
    second = kit.workers.start("--priorities", "default", env=ENV)
    wait_until(
        lambda: "partitions revoked" in first.log(),
        timeout=60,
        what="the first worker revoked a partition for the second",
        watch=[first, second],
    )
    # The revoked partition's failing job ends now, and its move opens a transaction; its
    # other job holds the revocation's wait far longer than the transaction timeout.
    failing.release()
    wait_until(
        lambda: "moves committed while a revocation waits" in first.log(),
        timeout=30,
        what="the moves' transaction committed during the wait",
        watch=[first, second],
    )
    holding.release()

    def dead() -> list[str | None]:
        return [stored.letter.job_id for stored in read_dead_letters(kit.settings).letters]

    wait_until(lambda: sorted(map(str, dead())) == sorted(failed), timeout=60, what="dead letters")
    assert first.alive(), first.log_tail()
    for worker in (first, second):
        worker.terminate()
        assert worker.wait(timeout=60) == 0, worker.log_tail()
    assert sorted(map(str, dead())) == sorted(failed)  # each once
