"""The retry relay after a commit Kafka did not confirm (a fake consumer and producer).

librdkafka goes on with a commit whose call timed out: it may yet be committed. Rewound to
the committed offsets before that commit ended, the relay read its jobs again, and the next
transaction (which ends that commit first) forwarded them a second time.
"""

from __future__ import annotations

import pytest

from pipeline import Settings
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.recovery import relay as relay_module
from tests.unit.test_transactions import OutageProducer
from tests.unit.worker.test_worker_relay import (
    TIER,
    FakeConsumer,
    GroupCommits,
    jobs_on_the_tier,
)


class GroupOutageProducer(GroupCommits, OutageProducer):
    """:class:`OutageProducer` whose committed offsets land in the consumer's group."""


def forwarded(relay: relay_module.RetryRelay, producer: GroupOutageProducer) -> list[str]:
    return [
        relay._codec.decode(value or b"").id
        for transaction in producer.committed
        for _, value in transaction
    ]


@pytest.mark.parametrize("outcome", ["committed", "aborted"])
def test_a_commit_kafka_did_not_confirm_is_settled_before_the_tier_is_read_again(
    monkeypatch: pytest.MonkeyPatch, outcome: str
) -> None:
    producer = GroupOutageProducer()
    monkeypatch.setattr(relay_module, "Consumer", FakeConsumer)
    monkeypatch.setattr(relay_module, "Producer", lambda conf: producer)
    failed: list[BaseException] = []
    relay = relay_module.RetryRelay(
        Settings(namespace="acme"), "acme.workers", WorkerMetrics(), on_failed=failed.append
    )
    relay._txn._sleep = lambda seconds: None
    consumer: FakeConsumer = relay._consumer  # type: ignore[assignment]
    producer.group = consumer
    jobs_on_the_tier(relay, consumer, 2)
    producer.down = frozenset({"commit_transaction"})  # the offsets went, then Kafka went away
    relay._turn()
    relay._commit()  # unconfirmed: it goes on in the background
    assert relay._txn.committing
    producer.down = frozenset()  # Kafka answers again
    producer.aborts_unconfirmed = outcome == "aborted"
    for _ in range(3):
        relay._turn()
        relay._commit()
    # Each job forwarded once: by the commit that went through, or again after its abort.
    assert forwarded(relay, producer) == ["job-0", "job-1"]
    assert consumer.group_committed[(TIER, 0)] == 2
    assert failed == []
