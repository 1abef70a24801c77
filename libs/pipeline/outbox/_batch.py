"""The relay's next batch: the first rows of the table in id order, as many as its bounds allow.

A batch is bounded three ways, each for a reason of its own:

- rows (``RelayOptions.batch_size``): what one Kafka transaction and one delete carry;
- bytes (``RelayOptions.batch_max_bytes``): the relay holds a batch's values while it publishes
  them, and a row may be as large as ``message.max.bytes`` (1 MB): by rows alone, 5,000 rows
  could be 5 GB;
- id ranges (:data:`._progress.MAX_RANGES`): the batch's progress record lists its ids as
  ranges, and must stay a message Kafka takes; ids skipped by rolled-back inserts make a range
  a row.

The relay reads the ids and sizes of up to ``batch_size`` rows first (a few bytes each), keeps
the longest run from the first row that fits the other two bounds, and then reads those rows
only. The first row is always kept: one larger than the byte budget is a batch of its own, never
a batch that cannot start. The batch is still the table's first rows in id order, so the order
and the crash windows of docs/outbox.md are those of a smaller ``batch_size``.

A batch also ends before the first row whose columns the relay cannot send as they are (a value
or key that is not bytes, a topic that is not text: on SQLite, whose columns take any type, a
row written by other means than the outbox's writer): :attr:`Batch.malformed` names it, and it
waits, with the rows after it, until it is fixed or deleted (:mod:`._typegate`). Rows are typed
here and only here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._dialect import Dialect, OutboxRow
from ._progress import MAX_RANGES

__all__ = ["Batch", "Malformed", "fitting", "read_batch", "typed"]

_CHUNK = 256
"""Rows taken from the cursor at a time (sqlite3 steps the statement as they are taken)."""
_BYTES = (bytes, bytearray, memoryview)
"""What a value or key may be read as (bytes from psycopg's BYTEA and sqlite3's BLOB)."""
_STORED = {str: "TEXT", int: "INTEGER", float: "REAL", bytes: "BLOB", type(None): "NULL"}
"""SQLite's storage classes, as sqlite3 returns them: the names an error line gives."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """A row the relay cannot send as it is: its id, and which columns have which wrong type
    (``value is TEXT (str), not a BLOB``)."""

    row_id: int
    problems: str


class Batch(list[OutboxRow]):
    """The rows of a batch in id order; ``malformed``: the row that ended it, whose columns have
    types the relay cannot send (None: no such row)."""

    def __init__(self, rows: Iterable[OutboxRow] = (), malformed: Malformed | None = None) -> None:
        super().__init__(rows)
        self.malformed = malformed


def read_batch(
    connection: Any, dialect: Dialect, table: str, max_rows: int, max_bytes: int
) -> Batch:
    """The next batch of ``table`` (empty: no rows, or the first is malformed), in one short
    read transaction."""
    cursor = connection.cursor()
    try:
        cursor.execute(dialect.sizes(table), (max_rows,))
        ids = fitting(cursor.fetchall(), max_bytes, MAX_RANGES)
        rows = _rows(cursor, dialect, table, ids) if ids else Batch()
    finally:
        cursor.close()
    connection.commit()  # ends the read transaction: no snapshot held between batches
    return rows


def fitting(sizes: Iterable[tuple[int, int]], max_bytes: int, max_ranges: int) -> list[int]:
    """The ids of the longest run of ``sizes`` (``(id, bytes)`` in id order) from the first whose
    bytes are at most ``max_bytes`` and whose ids make at most ``max_ranges`` ranges; the first
    id whatever its size."""
    ids: list[int] = []
    total = ranges = 0
    for row_id, size in sizes:
        total += size or 0  # NULL: a NULL value, in a table made without NOT NULL
        if not ids or row_id != ids[-1] + 1:
            ranges += 1
        if ids and (total > max_bytes or ranges > max_ranges):
            break
        ids.append(row_id)
    return ids


def _rows(cursor: Any, dialect: Dialect, table: str, ids: list[int]) -> Batch:
    """The rows ``ids``, in id order, up to the first malformed one. A row of another id is left
    out (the statement should select none): it would not be in the bounds the ids were chosen
    by."""
    wanted = set(ids)
    rows: list[OutboxRow] = []
    dialect.select(cursor, table, ids)
    while chunk := cursor.fetchmany(_CHUNK):
        for row in chunk:
            if row[0] not in wanted:
                continue
            row_typed = typed(row)
            if isinstance(row_typed, Malformed):
                return Batch(rows, row_typed)
            rows.append(row_typed)
    return Batch(rows)


def typed(row: Sequence[Any]) -> OutboxRow | Malformed:
    """``row`` (id, topic, key, value, job_id, as the driver returns them) as the relay sends
    it: value and key bytes (key None allowed), topic text; else what is wrong with it."""
    row_id, topic, key, value, job_id = row
    if type(topic) is str and type(value) is bytes and (key is None or type(key) is bytes):
        return (row_id, topic, key, value, job_id)  # as the writer stores it: the usual case
    problems = [
        f"{column} is {_stored(found)}, not {wanted}"
        for column, found, wanted, right in (
            ("topic", topic, "TEXT", isinstance(topic, str)),
            ("key", key, "a BLOB or NULL", key is None or isinstance(key, _BYTES)),
            ("value", value, "a BLOB", isinstance(value, _BYTES)),
        )
        if not right
    ]
    if problems:
        return Malformed(row_id, "; ".join(problems))
    return (row_id, topic, None if key is None else bytes(key), bytes(value), job_id)


def _stored(value: object) -> str:
    """How an error line names the type ``value`` was read as: ``TEXT (str)``."""
    name = type(value).__name__
    stored = _STORED.get(type(value))
    return f"{stored} ({name})" if stored else name
