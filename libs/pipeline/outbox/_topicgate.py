"""Rows for a topic Kafka does not have wait, in order, with an error that names the topic.

librdkafka fails a message to a topic it cannot find only after ``message.timeout.ms`` or its
metadata wait, inside the batch's transaction, which Kafka then aborts whole: the relay would
retry the same batch every half minute, with lines about aborted transactions. So before a
batch goes out its topics are looked up (each once; a topic found is not asked about again,
until a batch that holds it is one Kafka did not take: the topic may have been deleted).
The rows before the first one of a missing topic are published; that row and every row after
it wait in the table, in id order, until the topic exists (``pipeline topics apply`` creates a
namespace's topics). Rows are never skipped: a row's position is its job's order.

A row whose topic is not a name Kafka accepts (:data:`~pipeline._topiccheck.TOPIC_NAME_RULE`)
waits the same way, until the row is fixed or deleted; it is found without asking Kafka.
Looked up, such a name does not come back as missing (Kafka answers INVALID_TOPIC_EXCEPTION),
so its batch went out only for Kafka to refuse it; over 512 characters librdkafka refused the
lookup itself with a ``RuntimeError``, which restarted the relay every second.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException

from .._ratelog import RateLimitedLog
from .._topiccheck import (
    TOPIC_NAME_RULE,
    MetadataClient,
    not_authorized,
    topic_name_problem,
    unusable_topics,
)
from ._dialect import OutboxRow

__all__ = ["TopicGate"]

_log = logging.getLogger("pipeline.outbox")
LOG_EVERY_S = 30.0
"""How often the relay repeats that rows wait for a topic."""
LOOKUP_TIMEOUT_S = 10.0
_SHOWN_CHARS = 80
"""How much of an invalid topic name an error line shows."""


class TopicGate:
    """Which leading rows of a batch go to topics that exist (see the module docstring)."""

    def __init__(self, table: str, client: MetadataClient) -> None:
        self._table = table
        self._client = client
        self._known: set[str] = set()
        self._log = RateLimitedLog(_log, interval_s=LOG_EVERY_S)

    def passable(self, rows: list[OutboxRow]) -> int:
        """How many rows of ``rows``, from the first, are for topics that exist: all of them
        but for an invalid topic name or a missing topic (logged). Kafka not answering the
        lookup: all of them up to an invalid name (the batch's own produce then reports the
        outage, as it would without this check)."""
        new = {row[1] for row in rows} - self._known
        if not new:
            return len(rows)
        invalid = {topic: why for topic in new if (why := topic_name_problem(topic)) is not None}
        lookup = sorted(new - invalid.keys())
        try:
            # Missing, or an error of another kind: a topic this relay may not describe comes
            # back with TOPIC_AUTHORIZATION_FAILED, and its batch would be aborted every time.
            missing = set(unusable_topics(self._client, lookup, LOOKUP_TIMEOUT_S))
        except KafkaException:
            missing = set()
        else:
            self._known.update(topic for topic in lookup if topic not in missing)
        held = invalid.keys() | missing
        index = next((i for i, row in enumerate(rows) if row[1] in held), len(rows))
        if index == len(rows):
            return index
        row_id, topic = rows[index][0], rows[index][1]
        if topic in invalid:
            self._log.error(
                topic,
                "outbox row %d is a job for %s, which is not a valid Kafka topic name (%s; a "
                "name is %s): it and the rows after it wait in %s, in order, until the row's "
                "topic is fixed or the row is deleted",
                row_id,
                _shown(topic),
                invalid[topic],
                TOPIC_NAME_RULE,
                self._table,
            )
            return index
        refused = not_authorized(self._client, topic, LOOKUP_TIMEOUT_S)
        self._log.error(
            topic,
            "outbox row %d is a job for %s, which %s: it and the rows after it wait in %s, "
            "in order, until %s",
            row_id,
            topic,
            "this relay may not describe" if refused else "does not exist in Kafka",
            self._table,
            "the relay is allowed to write to it"
            if refused
            else "the topic exists (`pipeline topics apply` creates a namespace's topics)",
        )
        return index

    def forget(self, topics: set[str]) -> None:
        """Look ``topics`` up again before their next rows go (a batch that held them failed)."""
        self._known -= topics


def _shown(topic: str) -> str:
    """``topic`` quoted, as much of it as an error line shows."""
    if len(topic) <= _SHOWN_CHARS:
        return repr(topic)
    return f"{topic[:_SHOWN_CHARS]!r}..."
