"""A secured three-node cluster: the nodes form a quorum over mutual TLS, replicate over
SASL_SSL as the admin, and a user added on one node is let in by every node."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]

from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline_cli.devbroker import DevCluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_three_secured_nodes_replicate_and_share_users(
    dev_cluster_factory: Callable[..., DevCluster],
) -> None:
    cluster = dev_cluster_factory(nodes=3, secure=True)
    conf: dict[str, str | int | float | bool] = {
        **cluster.security().librdkafka(),
        "bootstrap.servers": cluster.bootstrap_servers,
    }
    admin = AdminClient(conf)
    assert sorted(admin.list_topics(timeout=30).brokers) == [1, 2, 3]
    topic = f"secured-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, 1, 3, config={"min.insync.replicas": "3"})])[topic].result(
        timeout=30
    )

    def in_sync() -> bool:
        partition = admin.list_topics(topic, timeout=10).topics[topic].partitions.get(0)
        return partition is not None and sorted(partition.isrs) == [1, 2, 3]

    # Every replica fetching from the leader: replication over SASL_SSL works.
    assert wait_for(in_sync, 60, interval=0.2), "the replicas did not all get in sync"

    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _message: Message) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({**conf, "acks": "all", "enable.idempotence": True})
    for i in range(10):
        producer.produce(topic, f"m{i}".encode(), on_delivery=delivered)
    assert producer.flush(60) == 0
    assert errors == []

    consumer = Consumer(
        {**conf, "group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest"}
    )
    values: list[bytes] = []
    try:
        consumer.subscribe([topic])

        def read() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
            return len(values) == 10

        assert wait_for(read, 60, interval=0), f"read {len(values)} of 10"
    finally:
        consumer.close()
    assert values == [f"m{i}".encode() for i in range(10)]

    # add_user returns once each node lets the user in; one at a time, each node does.
    user = cluster.add_user(f"user-{uuid.uuid4().hex[:8]}")
    for node in cluster.nodes:
        one: dict[str, str | int | float | bool] = {
            **user.librdkafka(),
            "bootstrap.servers": f"localhost:{node.port}",
        }
        # In, and seeing nothing: no ACL allows it to describe a topic.
        assert AdminClient(one).list_topics(timeout=15).topics == {}
