"""The transaction loop against a real Kafka: what commits is read back by a ``read_committed``
consumer with the consumed offsets committed for its group, what aborts is never seen, and a
newer producer of the same transactional id fences the older one."""

from __future__ import annotations

import os
import time
import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipeline._errors import TransactionAbortedError, TransactionFencedError
from pipeline._producer import producer_config
from pipeline._transactions import Transactions

if TYPE_CHECKING:
    from pipeline._settings import Settings


def create_topic(settings: Settings, name: str, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    topic = NewTopic(name, 1, 1, config=config or {})
    for future in admin.create_topics([topic], operation_timeout=20).values():
        future.result(timeout=30)


def transactional(settings: Settings, txn_id: str, *, renew: bool = False) -> Transactions:
    conf = producer_config(settings)
    conf.update({"transactional.id": txn_id, "transaction.timeout.ms": 60_000})
    txn = Transactions(
        Producer(conf),
        name="the test's producer",
        when_fenced="a newer one took over",
        renew=(lambda: Producer(conf)) if renew else None,
    )
    txn.init()
    return txn


def read_committed(settings: Settings, topic: str) -> list[bytes]:
    """Every message of ``topic`` a ``read_committed`` consumer sees, up to the topic's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 20,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for message in consumer.consume(100, 0.05):
                error = message.error()
                if error is None:
                    seen.append(message.value() or b"")
                elif error.code() == KafkaError._PARTITION_EOF:
                    return seen
                else:
                    pytest.fail(error.str())
        pytest.fail(f"{topic} was not read to its end within 20 s")
    finally:
        consumer.close()


def test_committed_units_are_read_back_and_aborted_ones_never(settings: Settings) -> None:
    source, sink = f"{settings.namespace}.source", f"{settings.namespace}.sink"
    create_topic(settings, source)
    create_topic(settings, sink)
    group = f"{settings.namespace}.group"
    consumer = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": group})
    txn = transactional(settings, f"{settings.namespace}.{uuid.uuid4().hex}")
    try:
        metadata = consumer.consumer_group_metadata()
        txn.run(
            lambda t: t.produce(sink, b"committed-1", b"k"),
            [TopicPartition(source, 0, 7)],
            metadata,
        )
        txn.produce(sink, b"aborted", b"k")  # an open transaction fed over time...
        txn.abort()  # ...given up
        txn.produce(sink, b"committed-2", None, headers=[("h", b"v")])
        txn.commit([TopicPartition(source, 0, 9)], metadata)
        assert not txn.open
        assert read_committed(settings, sink) == [b"committed-1", b"committed-2"]
        committed = consumer.committed([TopicPartition(source, 0)], timeout=20)
        assert committed[0].offset == 9  # the offsets went with the group's transaction
    finally:
        txn.close()
        consumer.close()


def test_a_newer_producer_of_the_id_fences_the_older_one(settings: Settings) -> None:
    sink = f"{settings.namespace}.sink"
    create_topic(settings, sink)
    txn_id = f"{settings.namespace}.shared"
    older = transactional(settings, txn_id)
    try:
        older.produce(sink, b"from the zombie", None)
        newer = transactional(settings, txn_id)  # aborts what the older one left open
        try:
            newer.run(lambda t: t.produce(sink, b"from the new one", None))
            with pytest.raises(TransactionFencedError, match="a newer one took over"):
                older.commit()
            assert not older.open
        finally:
            newer.close()
        assert read_committed(settings, sink) == [b"from the new one"]
    finally:
        older.close()


def test_a_message_the_broker_refused_aborts_the_unit_and_it_is_written_again(
    settings: Settings,
) -> None:
    sink = f"{settings.namespace}.sink"
    create_topic(settings, sink, {"max.message.bytes": "10000"})
    txn = transactional(settings, f"{settings.namespace}.{uuid.uuid4().hex}")
    attempts: list[int] = []

    def write(t: Transactions) -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            t.produce(sink, os.urandom(50_000), None)  # taken here, refused by the topic
            t.producer.flush(20)  # its refusal is in: the transaction can only be aborted
        t.produce(sink, b"small", None)

    try:
        txn.run(write)
        # The refusal at the second produce() was an abort, and the unit was written again
        # (librdkafka may abort the next commit once too, after the sequence it skipped).
        assert len(attempts) >= 2
        assert read_committed(settings, sink) == [b"small"]
    finally:
        txn.close()


def test_a_produce_after_a_fence_in_the_background_renews_the_producer(settings: Settings) -> None:
    sink = f"{settings.namespace}.sink"
    create_topic(settings, sink)
    txn_id = f"{settings.namespace}.renewed"
    txn = transactional(settings, txn_id, renew=True)
    intruder = transactional(settings, txn_id.replace("renewed", "other"))
    try:
        txn.produce(sink, b"before the fence", None)
        txn.producer.flush(20)
        intruder.close()
        intruder = transactional(settings, txn_id)  # fences txn's producer
        txn.produce(sink, b"fenced on its way", None)
        with pytest.raises(KafkaException, match="fenced"):
            txn.producer.flush(20)  # the broker's answer: the producer failed for good
        with pytest.raises(TransactionAbortedError, match="a new producer takes its place"):
            txn.produce(sink, b"refused", None)
        assert txn.renewals == 1
        txn.run(lambda t: t.produce(sink, b"written again", None))
        assert read_committed(settings, sink) == [b"written again"]
    finally:
        intruder.close()
        txn.close()
