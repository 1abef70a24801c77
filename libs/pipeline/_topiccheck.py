"""Whether the topics a client needs exist: a missing topic is a setup error, not an outage.

A consumer subscribed to a topic that does not exist gets an error event ("Subscribed topic not
available") and otherwise waits for ever, as it does while Kafka is down. A service that sees
such an event asks the cluster with :func:`missing_topics` and, if the topics are indeed
missing, stops with a :class:`~pipeline._errors.TopicMissingError` naming them and
``pipeline topics apply``. Asking first matters on a cluster whose brokers learn of a new topic
one after the other. On a cluster that authorizes, a topic the client may not describe is
missing from the metadata too: :func:`not_authorized` tells the two apart.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata

_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


class MetadataClient(Protocol):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata: ...


def is_missing_topic(error: KafkaError | None) -> bool:
    """Whether ``error`` says that a topic does not exist."""
    return error is not None and error.code() in _MISSING


def missing_topics(client: MetadataClient, topics: Iterable[str], timeout: float) -> list[str]:
    """Which of ``topics`` the cluster lacks (raises ``KafkaException`` if it does not answer)."""
    missing = []
    for topic in topics:
        found = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if found is None or is_missing_topic(found.error):
            missing.append(topic)
    return missing


def not_authorized(client: MetadataClient, topic: str, timeout: float) -> bool:
    """Whether Kafka refuses to describe ``topic`` to this client (which then sees it as
    missing): asked for by name, a topic it may not see comes with TOPIC_AUTHORIZATION_FAILED."""
    try:
        found = client.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException:
        return False
    error = found.error if found is not None else None
    return error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
