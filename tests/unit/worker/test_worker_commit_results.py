"""How commits are counted: one refused as the group rebalances is ``rebalance``, not ``error``,
so that ``PipelineCommitErrors`` fires on commits that fail outside a rebalance only (a long
scale-down, one member leaving every two minutes, kept it firing)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.commit.committer import Committer


class _Refusing:
    """A consumer whose synchronous commit raises ``error``."""

    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def commit(self, **kwargs: Any) -> None:
        raise KafkaException(self.error)


@pytest.mark.parametrize(
    ("code", "result"),
    [
        (KafkaError.REBALANCE_IN_PROGRESS, "rebalance"),
        (KafkaError.ILLEGAL_GENERATION, "rebalance"),
        (KafkaError.UNKNOWN_MEMBER_ID, "rebalance"),
        (KafkaError.STALE_MEMBER_EPOCH, "rebalance"),
        (KafkaError.FENCED_MEMBER_EPOCH, "rebalance"),
        (KafkaError.COORDINATOR_NOT_AVAILABLE, "error"),
        (KafkaError._TIMED_OUT, "error"),
    ],
)
def test_a_commit_refused_by_a_rebalance_is_not_an_error(code: int, result: str) -> None:
    metrics = WorkerMetrics()
    committer = Committer(metrics, interval_s=1.0, every=100)
    committer.on_commit(KafkaError(code), [TopicPartition("ns.jobs.default", 0, 5)])
    assert metrics.commits == {("async", result): 1}
    committer._consumer = _Refusing(KafkaError(code))  # type: ignore[assignment]
    assert not committer._commit_now([TopicPartition("ns.jobs.default", 0, 5)])
    assert metrics.commits == {("async", result): 1, ("sync", result): 1}


def test_a_commit_that_worked_is_ok() -> None:
    metrics = WorkerMetrics()
    committer = Committer(metrics, interval_s=1.0, every=100)
    committer.on_commit(None, [TopicPartition("ns.jobs.default", 0, 5)])
    assert metrics.commits == {("async", "ok"): 1}
