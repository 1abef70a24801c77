"""The moves' producer failing for good, against a real broker: a new producer takes its place,
the moves are written again, and each is committed once with its offset; the worker goes on.

Kafka fences a transactional producer for good when it aborts a transaction on timeout (a
consumer thread held up longer than ``transaction_timeout_ms``), and a broker crash can leave
it ``INVALID_TXN_STATE``. The first is what the slow test does; the quick one fences the
producer by registering its transactional id from another producer, the same fatal error at
once.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition

from pipeline import Settings
from pipeline._admin import apply_topics
from tests.waiting import wait_for

from .test_moves_outage import Thread, committed_values, consuming, owned

pytestmark = pytest.mark.kafka

AFTER = b"after"


class Factory:
    """Makes the mover's producers, keeping the configuration they were made with."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []

    def __call__(self, conf: dict[str, Any]) -> Producer:
        self.made.append(conf)
        return Producer(conf)


def commit_after_renewal(thread: Thread, factory: Factory, servers: str) -> None:
    """Turns until the moved job's offset is committed; then the checks."""
    thread.commit_point = 4  # the jobs at 1 to 3 succeeded meanwhile
    assert wait_for(thread.turn, 60), "the move was not committed with a new producer"
    assert len(factory.made) == 2, "the producer was not replaced"
    assert thread.mover._txn.renewals == 1
    values = committed_values(servers, thread.dlq)
    assert [v for v in values if v != AFTER] == [b"moved-0"]
    [position] = thread.consumer.committed([TopicPartition(thread.source, 0)], timeout=30)
    assert position.offset == 4


def test_a_fenced_moves_producer_is_replaced_and_its_moves_committed_once(
    bootstrap_servers: str, namespace: str
) -> None:
    settings = Settings(bootstrap_servers=bootstrap_servers, namespace=namespace)
    apply_topics(settings)
    factory = Factory()
    thread = consuming(bootstrap_servers, settings, factory)
    try:
        thread.move(0)
        thread.mover.drain(owned, lambda where: 1)  # in the open transaction
        assert thread.mover.open
        intruder = Producer(factory.made[0])
        intruder.init_transactions(30)  # fences the mover's producer: a fatal error
        commit_after_renewal(thread, factory, bootstrap_servers)
    finally:
        thread.close()


@pytest.mark.slow
def test_a_moves_producer_fenced_after_kafka_timed_its_transaction_out_is_replaced(
    bootstrap_servers: str, namespace: str
) -> None:
    settings = Settings(
        bootstrap_servers=bootstrap_servers,
        namespace=namespace,
        worker={"transaction_timeout_ms": 1000},
    )
    apply_topics(settings)
    factory = Factory()
    thread = consuming(bootstrap_servers, settings, factory)
    try:
        thread.move(0)
        thread.mover.drain(owned, lambda where: 1)  # in the open transaction, never committed
        # A record after it in every partition of the dead-letter topic: a read_committed reader
        # sees them all once Kafka has aborted the transaction (it holds its partition back).
        plain = Producer({"bootstrap.servers": bootstrap_servers})
        partitions = plain.list_topics(thread.dlq, timeout=30).topics[thread.dlq].partitions
        for p in partitions:
            plain.produce(thread.dlq, AFTER, partition=p)
        assert plain.flush(30) == 0
        assert wait_for(lambda: aborted(bootstrap_servers, thread.dlq, len(partitions)), 120)
        commit_after_renewal(thread, factory, bootstrap_servers)
    finally:
        thread.close()


def aborted(servers: str, topic: str, partitions: int) -> bool:
    """Whether the records written after the open transaction are all visible to a
    ``read_committed`` reader."""
    return committed_values(servers, topic).count(AFTER) == partitions
