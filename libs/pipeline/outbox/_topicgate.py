"""Rows for a topic Kafka does not have wait, in order, with an error that names the topic.

librdkafka fails a message to a topic it cannot find only after ``message.timeout.ms`` or its
metadata wait, inside the batch's transaction, which Kafka then aborts whole: the relay would
retry the same batch every half minute, with lines about aborted transactions. So before a
batch goes out its topics are looked up (each once; a topic found is not asked about again).
The rows before the first one of a missing topic are published; that row and every row after
it wait in the table, in id order, until the topic exists (``pipeline topics apply`` creates a
namespace's topics). Rows are never skipped: a row's position is its job's order.
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException

from .._ratelog import RateLimitedLog
from .._topiccheck import MetadataClient, missing_topics, not_authorized
from ._dialect import OutboxRow

__all__ = ["TopicGate"]

_log = logging.getLogger("pipeline.outbox")
LOG_EVERY_S = 30.0
"""How often the relay repeats that rows wait for a topic."""
LOOKUP_TIMEOUT_S = 10.0


class TopicGate:
    """Which leading rows of a batch go to topics that exist (see the module docstring)."""

    def __init__(self, table: str, client: MetadataClient) -> None:
        self._table = table
        self._client = client
        self._known: set[str] = set()
        self._log = RateLimitedLog(_log, interval_s=LOG_EVERY_S)

    def passable(self, rows: list[OutboxRow]) -> int:
        """How many rows of ``rows``, from the first, are for topics that exist: all of them
        but for a missing topic (logged). Kafka not answering the lookup: all of them (the
        batch's own produce then reports the outage, as it would without this check)."""
        new = {row[1] for row in rows} - self._known
        if not new:
            return len(rows)
        try:
            missing = set(missing_topics(self._client, sorted(new), LOOKUP_TIMEOUT_S))
        except KafkaException:
            return len(rows)
        self._known |= new - missing
        if not missing:
            return len(rows)
        index = next(i for i, row in enumerate(rows) if row[1] in missing)
        row_id, topic = rows[index][0], rows[index][1]
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
