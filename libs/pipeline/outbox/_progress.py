"""Which rows the relay's last committed Kafka transaction held, kept in Kafka by that transaction.

Each batch's transaction also commits an offset for the relay's consumer group
(``<ns>.outbox-relay.<table>``, which consumes nothing) on partition 0 of the namespace's
``default`` job topic, with the ids of the batch's rows in the offset's metadata (as ranges:
``outbox-relay/1:17-512,530-1017``). Kafka commits that offset with the batch or not at all. A
relay that becomes active reads it back once it has registered the transactional id (which
aborted whatever its predecessor left open) and deletes those ids: rows of a batch Kafka
committed but whose delete never happened (a relay killed between the two commits) are not
published a second time.
"""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from .._job import Priority
from .._settings import Settings
from .._topics import TopicNames
from ._dialect import OutboxRow

__all__ = ["MARK", "RelayProgress", "decode_ids", "encode_ids"]

MARK = "outbox-relay/1:"
"""What the metadata of a relay's offset starts with (the format's version)."""


def encode_ids(ids: list[int]) -> str:
    """``ids`` (ascending) as ranges: ``[1, 2, 3, 7, 9, 10]`` -> ``1-3,7,9-10``."""
    parts: list[str] = []
    start = previous = None
    for current in ids:
        if previous is not None and current == previous + 1:
            previous = current
            continue
        if start is not None:
            parts.append(_range(start, previous))
        start = previous = current
    if start is not None:
        parts.append(_range(start, previous))
    return ",".join(parts)


def _range(start: int, end: int | None) -> str:
    return str(start) if end is None or end == start else f"{start}-{end}"


def decode_ids(text: str) -> list[int]:
    """The ids of :func:`encode_ids`'s ranges; ValueError on anything else."""
    ids: list[int] = []
    for part in filter(None, text.split(",")):
        first, dash, last = part.partition("-")
        start, end = int(first), int(last) if dash else int(first)
        if end < start:
            raise ValueError(f"bad id range {part!r}")
        ids.extend(range(start, end + 1))
    return ids


def fitting(rows: Sequence[OutboxRow], limit: int) -> int:
    """How many of ``rows`` (ascending ids) have ids whose ranges fit ``limit`` characters."""
    length = len(MARK)
    previous: int | None = None
    for index, row in enumerate(rows):
        current = row[0]
        if previous is None or current != previous + 1:
            # A new range: a comma, the id, and room for "-<end>" should it grow into a range.
            length += 1 + 2 * len(str(current)) + 1
            if length > limit:
                return max(1, index)
        previous = current
    return len(rows)


class RelayProgress:
    """The relay group's offset: written with each batch, read back when a relay takes over."""

    def __init__(self, settings: Settings, group_id: str) -> None:
        self.limit = settings.worker.offset_metadata_max_bytes
        self.topic = TopicNames(settings.namespace).jobs(Priority.DEFAULT)
        self._consumer = Consumer(
            {
                **settings.client_config(),
                "group.id": group_id,
                "enable.auto.commit": False,
                "log_level": 0,
            }
        )

    @property
    def group_metadata(self) -> object:
        return self._consumer.consumer_group_metadata()

    def offsets(self, rows: list[OutboxRow]) -> list[TopicPartition]:
        """The offset to commit with the transaction of ``rows``."""
        ids = [row[0] for row in rows]
        metadata = MARK + encode_ids(ids)
        return [TopicPartition(self.topic, 0, ids[-1], metadata=metadata)]

    def last_committed(self, timeout: float) -> list[int]:
        """The row ids of the last batch a relay of this table committed ([]: none yet).

        Raises :class:`KafkaException` when Kafka does not answer within ``timeout``."""
        [found] = self._consumer.committed([TopicPartition(self.topic, 0)], timeout=timeout)
        if found.error is not None:
            raise KafkaException(found.error)
        metadata = found.metadata or ""
        if not metadata.startswith(MARK):
            return []
        return decode_ids(metadata.removeprefix(MARK))

    def close(self) -> None:
        self._consumer.close()
