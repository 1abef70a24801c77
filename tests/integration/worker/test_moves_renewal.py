"""The moves' producer failing for good, against a real broker: a new producer takes its place,
the moves are written again, and each is committed once with its offset; the worker goes on.

Kafka may fence a transactional producer for good when it aborts a transaction on timeout (a
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


def commit_after_renewal(
    thread: Thread, factory: Factory, servers: str, *, fenced: bool | None = True
) -> None:
    """Turns until the moved job's offset is committed; then the checks. ``fenced``: whether
    Kafka fenced the first producer, which must then have been replaced (None: Kafka may have
    fenced it or not, see below)."""
    thread.commit_point = 4  # the jobs at 1 to 3 succeeded meanwhile
    assert wait_for(thread.turn, 60), "the move was not committed"
    renewed = len(factory.made) - 1
    assert thread.mover._txn.renewals == renewed
    if fenced is None:
        assert renewed in (0, 1), f"{renewed} producers replaced the first"
    else:
        assert renewed == int(fenced), "the producer was not replaced"
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
def test_a_moves_transaction_kafka_timed_out_is_written_again_and_committed_once(
    bootstrap_servers: str, namespace: str
) -> None:
    """Kafka aborts the transaction at its timeout and bumps the producer's epoch. Whether the
    producer's next call then fails for good (fenced: it is replaced) or only asks for an abort
    (transactions version 2: the same producer writes it again) depends on when that call
    reaches the coordinator; both were seen with Kafka 4.4 and librdkafka 2.16. Either way the
    move is committed once, with its offset, and the worker goes on."""
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
        commit_after_renewal(thread, factory, bootstrap_servers, fenced=None)
    finally:
        thread.close()


def aborted(servers: str, topic: str, partitions: int) -> bool:
    """Whether the records written after the open transaction are all visible to a
    ``read_committed`` reader."""
    return committed_values(servers, topic).count(AFTER) == partitions
