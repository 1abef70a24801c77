"""An in-memory stand-in for the Kafka producer: what an application enqueues, kept in a list.

A service's own unit tests can check what it enqueues::

    transport = InMemoryTransport()
    app = Pipeline(transport=transport)
    signup(app, "a@b.c")
    [job] = transport.jobs(app.topics.jobs("default"))
    assert job.type == "email.send"
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message

from .._codec import JobCodec
from .._job import Job
from .._producer import DeliveryCallback
from ._partitioner import partition_for

__all__ = ["InMemoryTransport", "SentMessage"]


@dataclass(frozen=True, slots=True)
class SentMessage:
    """One message as the in-memory transport stored it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class InMemoryTransport:
    """Keeps produced messages in memory and acknowledges them on ``poll``/``flush``.

    Keyed messages go to the partition Kafka's default partitioner picks (murmur2 of the key,
    positive, modulo ``partitions``: the number a real topic with as many partitions gives);
    unkeyed ones round-robin.
    ``fail_with`` makes every delivery fail with that librdkafka error code, to test error paths.
    """

    def __init__(self, partitions: int = 6, fail_with: int | None = None) -> None:
        self.partitions = partitions
        self.fail_with = fail_with
        self.messages: list[SentMessage] = []
        self._offsets: dict[tuple[str, int], int] = defaultdict(int)
        self._round_robin = 0
        self._pending: list[tuple[SentMessage, DeliveryCallback]] = []
        self._codec = JobCodec()

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        if key is not None:
            partition = partition_for(key, self.partitions)
        else:
            partition = self._round_robin % self.partitions
            self._round_robin += 1
        offset = self._offsets[topic, partition]
        self._offsets[topic, partition] = offset + 1
        sent = SentMessage(topic, partition, offset, key, value)
        self._pending.append((sent, on_delivery))

    def poll(self, timeout: float = 0) -> int:
        pending, self._pending = self._pending, []
        for sent, on_delivery in pending:
            message = Message(
                topic=sent.topic,
                partition=sent.partition,
                offset=sent.offset,
                key=sent.key,
                value=sent.value,
            )
            if self.fail_with is None:
                self.messages.append(sent)
                on_delivery(None, message)
            else:
                on_delivery(KafkaError(self.fail_with), message)
        return len(pending)

    def flush(self, timeout: float) -> int:
        self.poll()
        return 0

    def close(self) -> None:
        self.poll()

    def jobs(self, topic: str) -> list[Job]:
        """The jobs produced to ``topic``, decoded, in produce order (acknowledging those not
        acknowledged yet, as a poll would)."""
        self.poll()
        return [self._codec.decode(m.value) for m in self.messages if m.topic == topic]
