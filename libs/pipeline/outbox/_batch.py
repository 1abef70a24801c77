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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._dialect import Dialect, OutboxRow
from ._progress import MAX_RANGES

__all__ = ["fitting", "read_batch"]

_CHUNK = 256
"""Rows taken from the cursor at a time (sqlite3 steps the statement as they are taken)."""


def read_batch(
    connection: Any, dialect: Dialect, table: str, max_rows: int, max_bytes: int
) -> list[OutboxRow]:
    """The next batch of ``table`` (empty: no rows), in one short read transaction."""
    cursor = connection.cursor()
    try:
        cursor.execute(dialect.sizes(table), (max_rows,))
        ids = fitting(cursor.fetchall(), max_bytes, MAX_RANGES)
        rows = _rows(cursor, dialect, table, ids) if ids else []
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
        total += size
        if not ids or row_id != ids[-1] + 1:
            ranges += 1
        if ids and (total > max_bytes or ranges > max_ranges):
            break
        ids.append(row_id)
    return ids


def _rows(cursor: Any, dialect: Dialect, table: str, ids: list[int]) -> list[OutboxRow]:
    """The rows ``ids``, in id order. A row of another id is left out (the statement should
    select none): it would not be in the bounds the ids were chosen by."""
    wanted = set(ids)
    rows: list[OutboxRow] = []
    dialect.select(cursor, table, ids)
    while chunk := cursor.fetchmany(_CHUNK):
        rows.extend(
            (row[0], row[1], bytes(row[2]) if row[2] is not None else None, bytes(row[3]), row[4])
            for row in chunk
            if row[0] in wanted
        )
    return rows
