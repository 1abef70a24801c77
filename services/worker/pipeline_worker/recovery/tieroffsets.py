"""The retry relay's offsets: where each tier partition it owns is committed next, and reading
back what Kafka committed after a transaction it could not commit.

A forward moves its partition's next offset past the message (:meth:`TierOffsets.forwarded`);
the open transaction commits the partitions it moved (:meth:`TierOffsets.to_commit`). A
partition with no forward pending is committed at its position now and then
(:meth:`TierOffsets.commit_idle`): a transaction's commit marker takes an offset in the tier
too, after the last job forwarded, and only the position shows it was read. After an abort the
consumer is sent back to what was committed (:meth:`TierOffsets.rewind`).
"""

from __future__ import annotations

from collections.abc import Container

from confluent_kafka import OFFSET_BEGINNING, OFFSET_INVALID, Consumer, TopicPartition

Where = tuple[str, int]


class TierOffsets:
    """Offsets of the tier partitions one relay owns (its thread only)."""

    def __init__(self, consumer: Consumer, timeout_s: float) -> None:
        self._consumer = consumer
        self._timeout = timeout_s
        self._next: dict[Where, int] = {}
        """Per owned partition: the offset to commit (one past the last forwarded; -1: none)."""
        self._dirty: set[Where] = set()
        """The partitions whose forwards are in the open transaction."""
        self._committed: dict[Where, int] = {}
        """Per owned partition: the offset committed last, by a transaction or as idle."""

    def assign(self, where: Where) -> None:
        self._next.setdefault(where, -1)

    def owns(self, where: Where) -> bool:
        return where in self._next

    def forget(self, where: Where) -> None:
        """``where`` is not ours any more."""
        self._next.pop(where, None)
        self._committed.pop(where, None)
        self._dirty.discard(where)

    def forwarded(self, where: Where, offset: int) -> None:
        """The message at ``offset`` of ``where`` went into the open transaction."""
        self._next[where] = offset + 1
        self._dirty.add(where)

    def abandon(self) -> None:
        """The open transaction was aborted: none of its forwards is pending any more."""
        self._dirty.clear()

    def pending(self, partitions: set[Where]) -> bool:
        """Whether the open transaction holds forwards of any of ``partitions``."""
        return not self._dirty.isdisjoint(partitions)

    def to_commit(self) -> list[TopicPartition]:
        """The offsets the open transaction commits."""
        return [TopicPartition(t, p, self._next[(t, p)]) for t, p in self._dirty]

    def committed(self, offsets: list[TopicPartition]) -> None:
        """Kafka committed the open transaction with ``offsets``."""
        for tp in offsets:
            self._committed[(tp.topic, tp.partition)] = tp.offset
        self._dirty.clear()

    def commit_idle(self, busy: Container[Where]) -> None:
        """Commit the position of the partitions not ``busy`` (their heads parked) where it
        passed what was committed. Raises the consumer's :class:`KafkaException`."""
        idle = [TopicPartition(*w) for w in self._next if w not in busy]
        if not idle:
            return
        ahead = [
            tp
            for tp in self._consumer.position(idle)
            if tp.offset >= 0 and tp.offset > self._committed.get((tp.topic, tp.partition), -1)
        ]
        if ahead:
            self._consumer.commit(offsets=ahead, asynchronous=False)
        for tp in ahead:
            self._committed[(tp.topic, tp.partition)] = tp.offset

    def rewind(self) -> None:
        """Forget the forwards of an aborted transaction: every owned partition reads on from
        what Kafka committed (from its start where nothing was: the aborted forwards were the
        first read, ``auto.offset.reset=earliest``). Raises the consumer's
        :class:`KafkaException` (Kafka does not answer) having moved nothing."""
        self._dirty.clear()
        owned = [TopicPartition(*where) for where in self._next]
        if not owned:
            return
        committed = self._consumer.committed(owned, timeout=self._timeout)
        self._consumer.resume(owned)
        for tp in committed:
            where = (tp.topic, tp.partition)
            if tp.offset != OFFSET_INVALID and tp.offset >= 0:
                self._consumer.seek(tp)
                self._next[where] = tp.offset
            else:
                self._consumer.seek(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))
                self._next[where] = -1
