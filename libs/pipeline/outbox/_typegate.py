"""A row whose columns have types the relay cannot send waits, in order, with an error naming it.

The writer stores a row's value and key as bytes (BLOB, BYTEA) and its topic as text; a row
written by other means may not (on SQLite, whose columns take any type: a row inserted by
another language, a SQL backfill, the ``sqlite3`` shell). Reading such a row raised a
``TypeError`` that restarted the relay every second, for ever, with nothing published, not even
the rows before it, and no line naming the row. :func:`._batch.read_batch` ends the batch before
it (:attr:`._batch.Batch.malformed`): the rows before it are published, and it and every row
after it wait in the table, in id order, as behind a missing topic (:mod:`._topicgate`), until
the row is fixed or deleted.
"""

from __future__ import annotations

import logging

from .._ratelog import RateLimitedLog
from ._batch import Batch

__all__ = ["TypeGate"]

_log = logging.getLogger("pipeline.outbox")
LOG_EVERY_S = 30.0
"""How often the relay repeats that rows wait behind a malformed row."""


class TypeGate:
    """Says which row ended a batch for the types of its columns (see the module docstring)."""

    def __init__(self, table: str) -> None:
        self._table = table
        self._log = RateLimitedLog(_log, interval_s=LOG_EVERY_S)

    def passable(self, batch: Batch) -> int:
        """How many rows of ``batch``, from the first, the relay can send: all of them (the
        batch ends before a malformed row); the malformed row that ended it is logged."""
        malformed = batch.malformed
        if malformed is not None:
            self._log.error(
                str(malformed.row_id),
                "outbox row %d cannot be sent as it is (%s): it and the rows after it wait in "
                "%s, in order, until the row is fixed (a BLOB value, a BLOB or NULL key, a TEXT "
                "topic; BYTEA is PostgreSQL's BLOB) or deleted",
                malformed.row_id,
                malformed.problems,
                self._table,
            )
        return len(batch)
