"""How many rows wait in an outbox table, and since when (``pipeline outbox status``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._job import now_ms
from ._dialect import DEFAULT_TABLE, checked_table, connect

__all__ = ["OutboxStatus", "outbox_status"]


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    table: str
    pending: int
    """Rows not relayed yet."""
    oldest_age_s: float | None
    """Seconds since the oldest of them was written; None when there is none."""

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "pending": self.pending, "oldest_age_s": self.oldest_age_s}


def outbox_status(dsn: str, table: str = DEFAULT_TABLE) -> OutboxStatus:
    """The rows waiting in ``table`` of the database at ``dsn``."""
    checked_table(table)
    connection, dialect = connect(dsn, create=False)  # a mistyped path: an error
    try:
        cursor = connection.cursor()
        cursor.execute(dialect.pending(table))
        count, oldest = cursor.fetchone()
        connection.rollback()
    finally:
        connection.close()
    age = None if oldest is None else max(0.0, (now_ms() - int(oldest)) / 1000)
    return OutboxStatus(table, int(count), age)
