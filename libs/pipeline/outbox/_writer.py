"""The writing side of the outbox: a job becomes a row of the service's own transaction.

The job is validated and encoded exactly as :meth:`pipeline.Pipeline.enqueue` would (same codec,
same topic, same partition key), and the row holds the Kafka message to be: topic, key, value.
The relay moves those bytes and nothing else, so what reaches Kafka is what ``enqueue`` would
have sent when the row was written.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigurationError, PayloadValidationError
from .._job import now_ms
from .._messagesize import LIBRDKAFKA_MESSAGE_MAX_BYTES, fits_in_message, too_large
from .._route import SHARED_KEY, Route
from ._dialect import DEFAULT_TABLE, Dialect, checked_table, dialect_of

__all__ = ["Outbox", "OutboxJob", "create_table", "outbox_route"]

OUTBOX_KEY_PREFIX = "outbox:"
"""The idempotency key of an outbox job enqueued without one: ``outbox:<job id>``."""


@dataclass(frozen=True, slots=True)
class OutboxJob:
    """One encoded job, as the outbox row keeps it."""

    job_id: str
    topic: str
    key: bytes | None
    value: bytes


Encode = Callable[[str, Mapping[str, Any] | None, dict[str, Any]], OutboxJob]
"""(job type, payload, enqueue options) -> the encoded job (the application's encoder)."""


def outbox_route(route: Route, job_id: str) -> Route:
    """``route`` with an idempotency key for sure: the caller's, else ``outbox:<job id>``.

    A row the relay publishes twice (it died after Kafka took the row, before it deleted it) is
    then a duplicate the workers drop. A job with neither key gets the new idempotency key as its
    partition key too, so both copies land on one partition, whose owner decides; an explicit
    ``key`` stays the partition key (its jobs keep their order).
    """
    if route.idempotency_key is not None:
        return route
    idempotency_key = f"{OUTBOX_KEY_PREFIX}{job_id}"
    key = route.key if route.key is not None else idempotency_key.encode()
    return dataclasses.replace(route, idempotency_key=idempotency_key, key=key)


def create_table(connection: Any, table: str = DEFAULT_TABLE) -> None:
    """Create the outbox table in ``connection``'s database if it does not exist, and commit
    (no right to create is needed when it exists).

    The relay does this when it starts too; call it (or run the DDL of docs/outbox.md in a
    migration) before the first write.
    """
    dialect = dialect_of(connection)
    cursor = connection.cursor()
    try:
        # Only when missing: PostgreSQL wants the right to create in the schema even for a
        # CREATE TABLE IF NOT EXISTS that creates nothing, and a relay needs SELECT, DELETE.
        if not dialect.has_table(cursor, checked_table(table)):
            cursor.execute(dialect.create(table))
    finally:
        cursor.close()
    connection.commit()


def _autocommitting(connection: Any) -> bool:
    """Whether a statement on ``connection`` would commit on its own: autocommit mode (sqlite3's
    ``isolation_level=None`` or ``autocommit=True``, psycopg's ``autocommit=True``) outside a
    transaction the caller opened (``BEGIN``, ``with connection.transaction():``)."""
    if isinstance(connection, sqlite3.Connection):
        autocommit = getattr(connection, "autocommit", None)  # Python 3.12 and later
        legacy = autocommit not in (True, False)
        return not connection.in_transaction and (
            autocommit is True or (legacy and connection.isolation_level is None)
        )
    if not getattr(connection, "autocommit", False):
        return False  # psycopg opens a transaction with the first statement
    from psycopg.pq import TransactionStatus  # a psycopg connection: psycopg is there

    return bool(connection.info.transaction_status == TransactionStatus.IDLE)


class Outbox:
    """Enqueues jobs as rows of the outbox table, in ``connection``'s current transaction.

    Made by :meth:`pipeline.Pipeline.outbox`. Nothing is committed here: the rows commit (or roll
    back) with the caller's transaction, and ``pipeline outbox relay`` publishes what committed.
    """

    __slots__ = ("_connection", "_dialect", "_encode", "_insert", "_max_bytes", "table")

    def __init__(
        self,
        connection: Any,
        encode: Encode,
        *,
        table: str = DEFAULT_TABLE,
        max_bytes: int = LIBRDKAFKA_MESSAGE_MAX_BYTES,
    ) -> None:
        self._connection = connection
        self._dialect: Dialect = dialect_of(connection)
        self._encode = encode
        self.table = checked_table(table)
        self._insert = self._dialect.insert(self.table)
        self._max_bytes = max_bytes
        """The largest message the relay's producer sends (its ``message.max.bytes``)."""

    def _in_transaction(self) -> None:
        """Refuse to write when the row would commit on its own (see :func:`_autocommitting`)."""
        if _autocommitting(self._connection):
            raise ConfigurationError(
                "the outbox writes into the caller's open transaction, and this connection is in "
                "autocommit mode outside one: the job would commit on its own, apart from the "
                "service's other writes. Open a transaction first (with psycopg, "
                "`with connection.transaction():`; with sqlite3, `BEGIN`, or a connection "
                "whose isolation_level is not None)"
            )

    def _note_missing_table(self, exc: Exception) -> None:
        """A driver's error about a missing table (raised on as it is, for the caller's
        handlers) gets a note saying how to create it."""
        # psycopg's UndefinedTable, by its SQLSTATE; sqlite3 has no code of its own for it.
        if getattr(exc, "sqlstate", None) == "42P01" or "no such table" in str(exc):
            exc.add_note(
                f"the outbox table {self.table!r} does not exist: create it with `pipeline "
                f"outbox init --table {self.table}`, or create_table(connection, "
                f"{self.table!r}) from pipeline.outbox"
            )

    def _job(self, job_type: str, payload: Mapping[str, Any] | None, options: Any) -> OutboxJob:
        """The encoded job, if the relay will be able to send it. A row Kafka refuses would
        stay at the head of the table, and every row behind it would wait: it is refused here,
        in the caller's transaction, as ``enqueue`` would have been refused by the producer."""
        job = self._encode(job_type, payload, options)
        if not fits_in_message(self._max_bytes, job.value, job.key):
            # The message key is the idempotency key (the caller's, else ``outbox:<id>``);
            # only the caller's can be too long, and the error says so, as ``enqueue``'s does.
            given = options.get("idempotency_key") is not None
            raise too_large(
                job_type,
                len(job.value) + len(job.key or b""),
                self._max_bytes,
                idempotency_key=len(job.key or b"") if given else 0,
            )
        return job

    def enqueue(
        self, job_type: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> str:
        """Validate and encode one job as ``app.enqueue`` would, add its row; return its id.

        Options are :meth:`pipeline.Pipeline.enqueue`'s (``priority``, ``delay``, ``run_at``,
        ``key``, ``idempotency_key``, ``tenant``, ``headers``, ``max_attempts``).
        """
        self._in_transaction()
        job = self._job(job_type, payload, options)
        cursor = self._connection.cursor()
        try:
            cursor.execute(self._insert, (job.topic, job.key, job.value, job.job_id, now_ms()))
        except Exception as exc:
            self._note_missing_table(exc)
            raise
        finally:
            cursor.close()
        return job.job_id

    def enqueue_many(
        self, job_type: str, payloads: Iterable[Mapping[str, Any]], **options: Any
    ) -> list[str]:
        """:meth:`enqueue` each of ``payloads`` with the same options, in one ``executemany``
        (one round trip on PostgreSQL, with psycopg's pipeline mode); their ids in order.
        Nothing is inserted when one payload fails validation. An ``idempotency_key`` is
        refused, as ``app.enqueue_many`` refuses it: every job would carry it, and run once."""
        if options.get("idempotency_key") is not None:
            raise ConfigurationError(SHARED_KEY)
        self._in_transaction()
        jobs = []
        for index, payload in enumerate(payloads):
            try:
                jobs.append(self._job(job_type, payload, options))
            except PayloadValidationError as exc:  # none of the batch is inserted
                raise exc.in_batch(index, []) from None
        at = now_ms()
        cursor = self._connection.cursor()
        try:
            cursor.executemany(
                self._insert, [(job.topic, job.key, job.value, job.job_id, at) for job in jobs]
            )
        except Exception as exc:
            self._note_missing_table(exc)
            raise
        finally:
            cursor.close()
        return [job.job_id for job in jobs]
