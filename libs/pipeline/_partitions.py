"""A topic's partitions, asked of Kafka in steps: a refusal of the credentials stops at once.

librdkafka reports a refused login as it reports an outage (see :mod:`pipeline._authfailure`):
a metadata request asked with the whole timeout would wait it out either way, and end as though
Kafka were down. :func:`cluster_metadata` asks in steps of at most a second instead, and after
each unanswered step reads the client's log lines (:class:`~pipeline._clientlog.LastProblemLog`):
a refusal raises :class:`~pipeline.KafkaAuthenticationError` (exit code 4) there and then, an
unreachable Kafka gets until the deadline. :func:`topic_partitions` is what the table reader
(:func:`pipeline._tablereader.read_table`) and the dead-letter reader call: it tells a missing
topic from one Kafka will not describe to this client, and either from an outage.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata

from ._errors import (
    KafkaAuthenticationError,
    KafkaUnavailableError,
    NotAuthorizedError,
    TopicMissingError,
)
from ._topiccheck import MetadataClient, not_authorized

if TYPE_CHECKING:
    from ._clientlog import LastProblemLog
    from ._settings import Settings

__all__ = ["PolledClient", "cluster_metadata", "topic_partitions", "unavailable"]

STEP_S = 1.0
"""The longest single metadata request: how late a refusal of the credentials is noticed."""

_LAST_S = 0.1
"""The shortest request; less than this left before the deadline ends the wait."""


class PolledClient(MetadataClient, Protocol):
    """A client whose ``poll`` hands librdkafka's log lines to its ``logger`` (a consumer)."""

    def poll(self, timeout: float = -1) -> object: ...


def unavailable(
    client: PolledClient, log: LastProblemLog, settings: Settings, timeout: float, reason: object
) -> KafkaUnavailableError | KafkaAuthenticationError:
    """The error to raise when Kafka did not answer within ``timeout``: its refusal of the
    credentials if ``log`` saw one, else an outage naming ``reason``, the client's last problem
    and what to do."""
    client.poll(0)  # collect librdkafka's log lines: they name the actual cause
    refused = log.refused(settings)
    if refused is not None:
        return refused
    if log.last_problem:
        reason = f"{reason}; {log.last_problem}"
    return KafkaUnavailableError(
        f"Kafka at {settings.bootstrap_servers} did not answer within {timeout:g}s ({reason}); "
        "is Kafka running? start one with `pipeline dev up`, or point "
        "PIPELINE_BOOTSTRAP_SERVERS at your cluster"
    )


def cluster_metadata(
    client: PolledClient,
    log: LastProblemLog,
    settings: Settings,
    *,
    deadline: float,
    timeout: float,
    topic: str | None = None,
) -> ClusterMetadata:
    """The cluster's metadata (``topic``'s alone when named), asked in steps until the
    ``time.monotonic()`` ``deadline``; ``timeout`` is the whole wait, as the error says it.

    Raises the refusal of the credentials as soon as ``log`` holds one, and
    :func:`unavailable` when the deadline passes unanswered.
    """
    while True:
        try:
            step = min(STEP_S, max(_LAST_S, deadline - time.monotonic()))
            metadata: ClusterMetadata = client.list_topics(topic, timeout=step)
            log.answered()
            return metadata
        except KafkaException as exc:
            client.poll(0)  # serves the log lines that may say it was refused
            if log.refusal is not None or deadline - time.monotonic() <= _LAST_S:
                raise unavailable(client, log, settings, timeout, _reason(exc)) from exc


def topic_partitions(
    client: PolledClient,
    log: LastProblemLog,
    settings: Settings,
    topic: str,
    *,
    deadline: float,
    timeout: float,
    metadata: ClusterMetadata | None = None,
) -> list[int]:
    """``topic``'s partition numbers, in order, from ``metadata`` (a listing the caller keeps
    for several topics) or else from a request for ``topic`` alone (:func:`cluster_metadata`).

    A topic the listing lacks raises :class:`NotAuthorizedError` when Kafka will not describe
    it to this client, else :class:`TopicMissingError`.
    """
    if metadata is None:
        metadata = cluster_metadata(
            client, log, settings, deadline=deadline, timeout=timeout, topic=topic
        )
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        if not_authorized(client, topic, max(_LAST_S, deadline - time.monotonic())):
            raise NotAuthorizedError("TOPIC", topic, "READ", settings.security.sasl_username)
        raise TopicMissingError([topic], settings.namespace)
    return sorted(found.partitions)


def _reason(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return error.str() if isinstance(error, KafkaError) else str(exc)
