"""A row Kafka refuses when its batch commits waits, in order, with an error that names it.

The other gates hold a row for what the relay sees itself; Kafka may still refuse a row they let
pass, when the batch's transaction commits: a topic whose ``max.message.bytes`` is below the
relay's ``message.max.bytes``, a topic the relay may describe but not write to, a topic deleted
since it was looked up. Kafka then aborts the whole transaction, which the relay sent again for
ever: nothing was published, not even the rows before that row, and no line named it.

A batch Kafka refuses (aborted for a reason other than an outage: see :func:`refusal_of`) is
published again in halves, each a batch of its own (its transaction, its progress record, its
delete), the first half first, halved again while Kafka refuses them: the rows before the
refused one go out in order, and the last batch refused is that row alone. It then waits, with
every row after it, in id order, as behind a missing topic (:mod:`._topicgate`), tried alone
again every :data:`HOLD_S` seconds until Kafka takes it or the row is deleted. Once the range of
the batch refused first is behind the relay, batches are whole again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException

from .._errors import TransactionAbortedError
from .._ratelog import RateLimitedLog
from .._transport import UNREACHABLE_CODES
from ._dialect import OutboxRow

__all__ = ["HOLD_S", "RefusalGate", "refusal_of"]

_log = logging.getLogger("pipeline.outbox")
LOG_EVERY_S = 30.0
"""How often the relay repeats that rows wait behind a row Kafka refused."""
HOLD_S = 30.0
"""How long a row Kafka refused waits before it is tried again, alone."""


def refusal_of(exc: Exception) -> str | None:
    """Kafka's reason for refusing what an aborted transaction held; None when ``exc`` says
    Kafka could not be reached or did not answer in time (:data:`UNREACHABLE_CODES`, or a
    :class:`~pipeline.KafkaUnavailableError`): the batch then waits for Kafka as it is."""
    if not isinstance(exc, TransactionAbortedError):
        return None
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, KafkaException):
        cause = cause.__cause__
    error = cause.args[0] if cause is not None and cause.args else None
    if not isinstance(error, KafkaError) or error.code() in UNREACHABLE_CODES:
        return None
    return str(error.str())


@dataclass(frozen=True, slots=True)
class _Held:
    row_id: int
    topic: str
    reason: str
    since: float


class RefusalGate:
    """Which leading rows of a batch go out while Kafka refuses one of them (see the module
    docstring): :meth:`refused` says what Kafka refused, :meth:`passable` bounds the batches
    after it."""

    def __init__(self, table: str) -> None:
        self._table = table
        self._cap: int | None = None
        """Rows per batch while the rows up to ``_until`` are published again in parts."""
        self._until = 0
        self._held: _Held | None = None
        self._log = RateLimitedLog(_log, interval_s=LOG_EVERY_S)

    def refused(self, rows: list[OutboxRow], reason: str) -> None:
        """Kafka refused the batch ``rows`` for ``reason``: the next batches are its halves
        (logged), or, for a single row, that row waits."""
        if len(rows) == 1:
            row_id, topic = rows[0][0], rows[0][1]
            self._held = _Held(row_id, topic, reason, time.monotonic())
            self._cap = None  # the rows after it go in whole batches again once it went
            return
        self._cap = len(rows) // 2
        self._until = max(self._until, rows[-1][0])
        _log.warning(
            "Kafka refused the batch of %d outbox rows from id %d to %d (%s): publishing them "
            "again %d at a time, in order, to find the row it refuses",
            len(rows),
            rows[0][0],
            rows[-1][0],
            reason,
            self._cap,
        )

    def passable(self, rows: list[OutboxRow]) -> int:
        """How many rows of ``rows``, from the first, go out now: those before a row Kafka
        refused (logged while it waits; alone once its wait is over), at most half of a batch
        Kafka refused while its rows are published again."""
        if not rows:
            return 0
        limit, held = len(rows), self._held
        if held is not None:
            index = next((i for i, row in enumerate(rows) if row[0] == held.row_id), None)
            if index is None and rows[0][0] > held.row_id:
                self._held = None  # published alone, or deleted
            elif index == 0 and time.monotonic() - held.since < HOLD_S:
                self._log.error(
                    str(held.row_id),
                    "outbox row %d is a job for %s, which Kafka refused when its batch "
                    "committed (%s): it and the rows after it wait in %s, in order, until Kafka "
                    "takes it (it is tried again alone every %gs: check the topic's "
                    "max.message.bytes and the relay's ACLs) or the row is deleted",
                    held.row_id,
                    held.topic,
                    held.reason,
                    self._table,
                    HOLD_S,
                )
                return 0
            elif index is not None:
                limit = max(index, 1)  # the rows before it; it alone once its wait is over
        if self._cap is not None and rows[0][0] > self._until:
            self._cap = None  # the batch Kafka refused is behind: whole batches again
        return limit if self._cap is None else min(self._cap, limit)
