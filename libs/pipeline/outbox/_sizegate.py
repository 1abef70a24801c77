"""A row larger than the relay's producer sends waits, in order, with an error that names it.

The writer refuses such a job (``PayloadValidationError``) by its own ``message.max.bytes``; a
row may still be larger than the relay's (a writer whose ``kafka`` options raise the limit, a
row written by other means). librdkafka refuses it inside the batch's transaction, which the
relay then gave up whole, every time, and every row behind it waited. The rows before it are
published; it and every row after it wait in the table, in id order, as behind a missing topic
(:mod:`._topicgate`), until the relay's ``message.max.bytes`` takes it or the row is deleted.
"""

from __future__ import annotations

import logging

from .._messagesize import fits_in_message
from .._ratelog import RateLimitedLog
from ._dialect import OutboxRow

__all__ = ["SizeGate"]

_log = logging.getLogger("pipeline.outbox")
LOG_EVERY_S = 30.0
"""How often the relay repeats that rows wait behind a row too large."""


class SizeGate:
    """Which leading rows of a batch the producer takes (see the module docstring)."""

    def __init__(self, table: str, max_bytes: int) -> None:
        self._table = table
        self._max_bytes = max_bytes
        self._log = RateLimitedLog(_log, interval_s=LOG_EVERY_S)

    def passable(self, rows: list[OutboxRow]) -> int:
        """How many rows of ``rows``, from the first, are within the producer's limit (the
        writer's measure: value, key and a record's overhead); a row beyond it is logged."""
        for index, (row_id, topic, key, value, _job_id) in enumerate(rows):
            if not fits_in_message(self._max_bytes, value, key):
                size = len(value) + len(key or b"")
                self._log.error(
                    str(row_id),
                    "outbox row %d takes %d bytes and more as a Kafka message for %s, more than "
                    "the %d this relay's producer sends (message.max.bytes): it and the rows "
                    "after it wait in %s, in order, until the relay's kafka options raise "
                    "message.max.bytes (and the topic's max.message.bytes takes it), or the row "
                    "is deleted",
                    row_id,
                    size,
                    topic,
                    self._max_bytes,
                    self._table,
                )
                return index
        return len(rows)
