"""The librdkafka options of the producers that send jobs (the application's, the services')."""

from __future__ import annotations

from typing import Any

from ._settings import Settings

__all__ = ["producer_config"]


def producer_config(settings: Settings, *, bulk: bool = False) -> dict[str, Any]:
    """librdkafka options for producing jobs: idempotent, ``acks=all``, bounded delivery time.

    ``bulk``: the options of the producer that ``enqueue_many`` uses, which lingers
    ``producer.bulk_linger_ms`` to fill bigger batches.
    """
    conf: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        # The Java client's partitioner, so that a key maps to the same partition whichever
        # language produced the job (librdkafka's default hashes keys with CRC32 instead).
        "partitioner": "murmur2_random",
        # Unkeyed jobs go to a random partition each. librdkafka's default sticks to one
        # partition for a while, so a burst (all of it, from a producer still fetching
        # metadata) lands on one partition and one worker runs it while the others idle.
        "sticky.partitioning.linger.ms": 0,
        "linger.ms": settings.producer.bulk_linger_ms if bulk else settings.producer.linger_ms,
        "compression.type": settings.producer.compression,
        "delivery.timeout.ms": int(settings.producer.delivery_timeout_s * 1000),
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        # A job is one small request: sent at once, not held back until the broker acknowledges
        # the previous one (Nagle's algorithm against its delayed ACKs). Only recent librdkafka
        # releases turn Nagle off by default; older ones that confluent-kafka 2.6 brings do not.
        "socket.nagle.disable": True,
        # Never ask Kafka to create a topic it does not know (librdkafka's producer does by
        # default, and so do brokers): a mistyped namespace, or an enqueue before `topics
        # apply`, would create a topic of one partition that no worker reads, and the job
        # would be acknowledged. It fails instead, naming the topic.
        "allow.auto.create.topics": False,
    }
    conf.update(settings.client_config())
    return conf
