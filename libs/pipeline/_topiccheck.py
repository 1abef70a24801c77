"""Whether the topics a client needs exist: a missing topic is a setup error, not an outage.

A consumer subscribed to a topic that does not exist gets an error event ("Subscribed topic not
available") and otherwise waits for ever, as it does while Kafka is down. A service that sees
such an event asks the cluster with :func:`missing_topics` and, if the topics are indeed
missing, stops with a :class:`~pipeline._errors.TopicMissingError` naming them and
``pipeline topics apply``. Asking first matters on a cluster whose brokers learn of a new topic
one after the other. On a cluster that authorizes, a topic the client may not describe is
missing from the metadata too: :func:`not_authorized` tells the two apart. A name Kafka would
refuse is told apart before any of that, locally: :func:`topic_name_problem`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata

_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})
MAX_TOPIC_NAME_LENGTH = 249
"""The longest topic name Kafka accepts."""
TOPIC_NAME_RULE = "1 to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-', other than '.' and '..'"
"""Kafka's rule for a topic name (``org.apache.kafka.common.internals.Topic.validate``)."""
_ILLEGAL_CHARACTER = re.compile(r"[^a-zA-Z0-9._-]")


class MetadataClient(Protocol):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata: ...


REFUSED_READS = {
    KafkaError.GROUP_AUTHORIZATION_FAILED: "GROUP",
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "TOPIC",
}
"""Consumer errors no retry cures: the kind of resource whose READ Kafka's ACLs refuse."""


def is_missing_topic(error: KafkaError | None) -> bool:
    """Whether ``error`` says that a topic does not exist."""
    return error is not None and error.code() in _MISSING


def topic_name_problem(name: str) -> str | None:
    """Why Kafka refuses ``name`` as a topic name (:data:`TOPIC_NAME_RULE`); None: it does not.

    Checked locally, before any lookup: Kafka answers a lookup of such a name with an error that
    does not say the topic is missing, and librdkafka refuses a name over 512 characters with a
    ``RuntimeError`` of its own."""
    if not name:
        return "it is empty"
    if name in {".", ".."}:
        return f"{name!r} is not allowed"
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return f"it is {len(name)} characters long, more than {MAX_TOPIC_NAME_LENGTH}"
    illegal = sorted(set(_ILLEGAL_CHARACTER.findall(name)))
    if illegal:
        more = ", ..." if len(illegal) > 5 else ""
        return "it holds " + ", ".join(repr(c) for c in illegal[:5]) + more
    return None


def missing_topics(client: MetadataClient, topics: Iterable[str], timeout: float) -> list[str]:
    """Which of ``topics`` the cluster lacks (raises ``KafkaException`` if it does not answer)."""
    missing = []
    for topic in topics:
        found = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if found is None or is_missing_topic(found.error):
            missing.append(topic)
    return missing


def unusable_topics(client: MetadataClient, topics: Iterable[str], timeout: float) -> list[str]:
    """Which of ``topics`` the cluster lacks or answers for with any error: one this client
    may not describe among them (:func:`not_authorized` tells which); raises
    ``KafkaException`` if it does not answer."""
    unusable = []
    for topic in topics:
        found = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if found is None or found.error is not None:
            unusable.append(topic)
    return unusable


def not_authorized(client: MetadataClient, topic: str, timeout: float) -> bool:
    """Whether Kafka refuses to describe ``topic`` to this client (which then sees it as
    missing): asked for by name, a topic it may not see comes with TOPIC_AUTHORIZATION_FAILED."""
    try:
        found = client.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException:
        return False
    error = found.error if found is not None else None
    return error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
