"""Whether the topics a leader reads gained partitions during its term.

A term assigns itself every partition of ``<ns>.deferred`` and of the wait tiers when it
starts. Partitions added later (``pipeline topics apply`` with more partitions) would not be
read until the next term, which may be weeks away, and the delayed jobs producers write to
them would wait as long. The leader looks at the topics' metadata now and then and ends its
term when a count changed; the next term, begun at once, reads them all.

:func:`term_partitions` reads the counts a term begins with. A topic the cluster confirms
missing is a setup error, as for the worker (a namespace whose ``pipeline topics apply`` was
not run, or run with fewer wait tiers): :class:`TopicMissingError`, which stops the process
(exit 1) instead of retrying the lead for ever.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException

from pipeline._errors import KafkaUnavailableError, NotAuthorizedError, TopicMissingError
from pipeline._topiccheck import (
    MetadataClient,
    is_missing_topic,
    missing_topics,
    not_authorized,
)

__all__ = ["PartitionWatch", "term_partitions"]

_log = logging.getLogger("pipeline.scheduler")


def term_partitions(
    client: MetadataClient,
    topics: list[str],
    namespace: str,
    timeout: float = 30.0,
    *,
    user: str | None = None,
) -> dict[str, list[int]]:
    """The partitions of each of ``topics``. Raises :class:`TopicMissingError` for topics the
    cluster confirms missing (asked again by name: a broker may not know a new topic yet),
    :class:`NotAuthorizedError` for one Kafka's ACLs hide from ``user`` (no READ, which allows
    describing it: it looks missing), and :class:`KafkaUnavailableError` for a topic it cannot
    describe now (to try again)."""
    metadata = client.list_topics(timeout=timeout)
    found: dict[str, list[int]] = {}
    absent: list[str] = []
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or is_missing_topic(meta.error):
            absent.append(topic)
        elif meta.error is not None:
            raise KafkaUnavailableError(f"topic {topic} cannot be read now: {meta.error.str()}")
        else:
            found[topic] = sorted(meta.partitions)
    if absent:
        missing = missing_topics(client, absent, timeout=5.0)
        if missing:
            raise TopicMissingError(missing, namespace)
        for topic in absent:
            if not_authorized(client, topic, 5.0):
                raise NotAuthorizedError("TOPIC", topic, "READ", user, "scheduler")
        raise KafkaUnavailableError(f"topics {', '.join(absent)} are not known to every broker yet")
    return found


class PartitionWatch:
    """The partition counts a term began with, compared with the cluster's every ``every_s``
    (``scheduler.partitions_check_s``: one metadata request, answered by any broker)."""

    def __init__(
        self,
        counts: Mapping[str, int],
        *,
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counts = dict(counts)
        self._every_s = every_s
        self._clock = clock
        self._next = clock() + every_s

    def changed(self, list_topics: Callable[..., Any]) -> bool:
        """Whether a topic's partition count differs from the term's (asked at most every
        ``every_s``; a metadata request that fails answers no, and is asked again next time).
        ``list_topics``: the consumer's."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._every_s
        try:
            metadata = list_topics(timeout=10.0)
        except KafkaException as exc:
            _log.debug("could not read the topics' metadata: %s", exc)
            return False
        for topic, count in self._counts.items():
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                continue  # a topic gone is the consumer's error to report
            if len(meta.partitions) != count:
                _log.info(
                    "%s has %d partitions, %d when this term began: starting a new term to "
                    "read them all",
                    topic,
                    len(meta.partitions),
                    count,
                )
                return True
        return False
