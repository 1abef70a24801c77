"""Which records a refresh of the dead-letter index reads: from where the last one ended, to
the end or to a limit (a deep topic is read in steps)."""

from __future__ import annotations

from collections.abc import Collection

Marks = dict[tuple[str, int], tuple[int, int]]
"""``(topic, partition) -> (low, high)`` watermarks."""


def where_to_start(
    marks: Marks,
    next_offsets: dict[tuple[str, int], int],
    lows: dict[int, int],
    topic: str,
    renewed: Collection[str] = (),
) -> tuple[dict[tuple[str, int], int], set[int]]:
    """Where to read each partition from (the offset after the last read, or the partition's
    low watermark when the log is not where it was), and the partitions of ``topic`` deleted
    and created again since the last read: every partition of a topic in ``renewed`` (its id
    changed, see :mod:`._topicids`), and those whose end went back below the offset read to,
    or whose start went back below ``lows`` (the low watermarks seen); and those read before
    that the topic has no more (only a topic created again has fewer partitions)."""
    starts: dict[tuple[str, int], int] = {}
    present = {partition for where_topic, partition in marks if where_topic == topic}
    recreated = {p for t, p in next_offsets if t == topic and p not in present}
    for where, (low, high) in marks.items():
        start = next_offsets.get(where, low)
        gone = where[0] in renewed or start > high  # recreated
        # Recreated, or retention went past the last read.
        starts[where] = low if gone or start < low else start
        if where[0] == topic and (gone or low < lows.get(where[1], 0)):
            recreated.add(where[1])
    return starts, recreated


def bounded(
    marks: Marks,
    starts: dict[tuple[str, int], int],
    topic: str,
    limit: int | None,
) -> Marks:
    """``marks`` with the high watermarks of ``topic`` lowered so that at most about ``limit``
    of its records are read from ``starts``."""
    if limit is None:
        return marks
    partitions = [where for where in marks if where[0] == topic]
    share = max(1, -(-limit // max(1, len(partitions))))
    bounded = dict(marks)
    for where in partitions:
        low, high = marks[where]
        bounded[where] = (low, min(high, starts[where] + share))
    return bounded
