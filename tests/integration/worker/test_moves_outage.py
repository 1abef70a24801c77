"""The worker's moves through a broker outage, against a real broker stopped and started again
under them: driven as the consumer thread drives them (drain, commit, poll), no turn blocks
the thread for long, and every move is made once, with its offset, when Kafka is back.

librdkafka's own behaviour is what is under test here: ``send_offsets_to_transaction()``
waits for its request's timeout, not for the call's; a commit or an abort that timed out goes
on in the background and refuses every other call until it is called again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from pipeline import Settings
from pipeline._admin import apply_topics
from pipeline._topics import TopicNames
from pipeline._transactions import STEP_TIMEOUT_S
from pipeline_cli.devbroker import DevCluster
from pipeline_worker.commit.moves import Mover
from pipeline_worker.route.policy import Record

TURN_LIMIT_S = 2 * STEP_TIMEOUT_S + 1.0
"""The longest a turn may keep the consumer thread from polling (the offsets, then the abort,
each one call), with a margin for a loaded machine; /healthz calls 15 s stuck."""
OUTAGE_S = 25.0


def owned(where: tuple[str, int]) -> bool:
    return True


class Thread:
    """What the consumer thread does with the moves, turn after turn: drain, commit, poll."""

    def __init__(
        self,
        settings: Settings,
        consumer: Consumer,
        source: str,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        self.loop = asyncio.new_event_loop()
        self.mover = Mover(settings, self.loop, producer_factory=producer_factory)
        self.consumer = consumer
        self.source = source
        self.dlq = TopicNames(settings.namespace).dlq
        self.written: list[int] = []
        self.commit_point = 1  # offset 0 failed and is moved; 1 to 3 still run
        self.longest = 0.0

    def move(self, offset: int) -> None:
        def done(ok: bool) -> None:
            if ok:
                self.written.append(offset)

        record = Record(self.dlq, b"moved-%d" % offset, b"key")
        self.mover.submit((self.source, 0), offset, [record], done)

    def turn(self, *, reachable: bool = False) -> bool:
        """One turn; whether the commit point was committed: with the moves' transaction, or
        (``reachable``: asynchronous commits, which the worker makes, are left out before)
        by the consumer when no transaction is open and no move of the partition waits."""
        mover = self.mover
        started = time.monotonic()
        mover.drain(owned, lambda where: self.commit_point)
        offsets = [TopicPartition(self.source, 0, self.commit_point)]
        committed = False
        if mover.open:
            committed = mover.commit(offsets, self.consumer.consumer_group_metadata(), owned)
        elif reachable and (self.source, 0) not in mover.stranded():
            try:
                self.consumer.commit(offsets=offsets, asynchronous=False)
                committed = True
            except KafkaException:  # the group rebalances after the outage: again later
                pass
        self.longest = max(self.longest, time.monotonic() - started)
        self.loop.call_soon(self.loop.stop)
        self.loop.run_forever()  # the moves' callbacks
        self.consumer.poll(0.05)
        return committed

    def close(self) -> None:
        self.mover.close()
        self.consumer.close()
        self.loop.close()


def consuming(
    servers: str,
    settings: Settings,
    producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
) -> Thread:
    """Four jobs on partition 0 of the default priority, consumed by a member of the group."""
    source = TopicNames(settings.namespace).jobs("default")
    producer = Producer({"bootstrap.servers": servers})
    for i in range(4):
        producer.produce(source, b"job-%d" % i, partition=0)
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"{settings.namespace}.workers",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([source])
    taken = 0
    deadline = time.monotonic() + 60
    while taken < 4:
        assert time.monotonic() < deadline, "the jobs were not consumed"
        message = consumer.poll(0.5)
        taken += message is not None and message.error() is None
    return Thread(settings, consumer, source, producer_factory)


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["clean", "crash"])
def test_moves_made_before_and_during_an_outage_are_each_made_once_after_it(
    namespace: str, dev_cluster_factory: Callable[..., DevCluster], stop: str
) -> None:
    cluster = dev_cluster_factory(1)
    settings = Settings(bootstrap_servers=cluster.bootstrap_servers, namespace=namespace)
    apply_topics(settings)
    thread = consuming(cluster.bootstrap_servers, settings)
    try:
        thread.move(0)
        thread.mover.drain(owned, lambda where: 1)  # in the open transaction
        cluster.stop_node(0, hard=stop == "crash")
        halfway = time.monotonic() + OUTAGE_S / 2
        while time.monotonic() < halfway:
            assert not thread.turn()
        thread.move(2)  # offset 2 fails while Kafka is down
        while time.monotonic() < halfway + OUTAGE_S / 2:
            assert not thread.turn()
        # That move waited (its job unfinished), or went into a transaction Kafka has not
        # committed (an abort with nothing registered at the coordinator needs no answer).
        cluster.start_node(0)
        deadline = time.monotonic() + 120
        while True:
            assert time.monotonic() < deadline, "the moves were not committed after the outage"
            if thread.written == [0, 2]:
                thread.commit_point = 4  # the jobs at 1 and 3 succeeded meanwhile
            point = thread.commit_point
            if thread.turn(reachable=True) and point == 4:
                break
        assert thread.longest <= TURN_LIMIT_S
        assert committed_values(cluster.bootstrap_servers, thread.dlq) == [b"moved-0", b"moved-2"]
        [position] = thread.consumer.committed([TopicPartition(thread.source, 0)], timeout=30)
        assert position.offset == 4
    finally:
        thread.close()


def committed_values(servers: str, topic: str) -> list[bytes | None]:
    """The values of ``topic``'s committed records, read to its end."""
    reader = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "moves-outage-reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        count = len(reader.list_topics(topic, timeout=30).topics[topic].partitions)
        reader.assign([TopicPartition(topic, p, 0) for p in range(count)])
        values: list[bytes | None] = []
        ends = 0
        deadline = time.monotonic() + 60
        while ends < count and time.monotonic() < deadline:
            message = reader.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                ends += 1  # the end of a partition
                continue
            values.append(message.value())
        return values
    finally:
        reader.close()
