"""Reading a table whole: every committed message of a compacted topic, beginning to end.

The ``<ns>.schedules`` table, the scheduler's state and the workers' heartbeats are read so.
Such a topic has one partition when ``pipeline topics apply`` creates it. One created otherwise
may have several, and a key's records may be in more than one (written before partitions were
added, when the key hashed elsewhere): :class:`Newest` says which record of a key wins. A
writer of such a topic writes to partition 0 only (with a tombstone of the key in the others,
see :mod:`pipeline._scheduletable`), so partition 0's last record of a key wins whenever there
is one; a key partition 0 does not hold takes its newest record by timestamp among the last
records of the other partitions (what writers of earlier releases left).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._clientlog import LastProblemLog
from ._errors import KafkaUnavailableError, TopicMissingError
from ._newclient import client
from ._partitions import topic_partitions, unavailable

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["Newest", "read_table"]

V = TypeVar("V")


class Newest(Generic[V]):
    """Each key's winning record of a table topic, fed its records in the order they are read
    (see the module docstring)."""

    def __init__(self) -> None:
        self._first: dict[str, V] = {}
        """Partition 0's last record of each key."""
        self._rest: dict[str, dict[int, tuple[int, V]]] = {}
        """The other partitions' last record of each key, with its timestamp, by partition."""

    def add(self, key: str, record: V, partition: int, timestamp: int) -> V:
        """Take ``record`` of ``key``, read at ``partition`` with ``timestamp``; the record of
        ``key`` that wins now."""
        if partition == 0:
            self._first[key] = record
            return record
        others = self._rest.setdefault(key, {})
        others[partition] = (timestamp, record)
        return self._first[key] if key in self._first else _latest(others)

    def winners(self) -> dict[str, V]:
        """The winning record of every key read."""
        won = {key: _latest(others) for key, others in self._rest.items()}
        won.update(self._first)
        return won


def _latest(records: dict[int, tuple[int, V]]) -> V:
    return max(records.values(), key=lambda stamped: stamped[0])[1]


def read_table(
    settings: Settings, topic: str, timeout: float = 30.0, *, missing_ok: bool = False
) -> list[tuple[str, bytes | None]]:
    """The winning record of each key of ``topic`` (:class:`Newest`), read from its beginning
    to its end (committed messages only), as (key, value); with
    ``missing_ok``, none when the topic does not exist (else :class:`TopicMissingError`).
    A refusal of the credentials raises at once, not after ``timeout`` (see
    :mod:`pipeline._partitions`)."""
    import time

    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf: dict[str, Any] = {
        "logger": LastProblemLog(),  # see _scheduletable._producer
        "group.id": f"{settings.namespace}.table-reader",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        # The end is known when a fetch at it comes back empty: the broker's default wait for
        # data there (500 ms) would hold up every reading, a standby's takeover among them.
        "fetch.wait.max.ms": 10,
        **settings.client_config(),
    }
    consumer = client(Consumer, conf)
    deadline = time.monotonic() + timeout  # for the whole read, not each step of it
    try:
        try:
            partitions = topic_partitions(
                consumer, conf["logger"], settings, topic, deadline=deadline, timeout=timeout
            )
        except TopicMissingError:
            if missing_ok:
                return []
            raise
        tps = [TopicPartition(topic, p, -2) for p in partitions]
        try:
            pending = _not_empty(consumer, tps, deadline)
        except KafkaException as exc:  # the metadata came, a partition's leader did not
            reason = f"the end of {topic}: {exc.args[0].str()}"
            raise unavailable(consumer, conf["logger"], settings, timeout, reason) from exc
        newest: Newest[bytes | None] = Newest()
        if not pending:
            return []
        consumer.assign([tp for tp in tps if tp.partition in pending])
        while pending:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"reading {topic} took longer than {timeout:g}s")
            # poll() returns at the first message (or end of partition); consume(n, 0) takes
            # what is there. consume(n, timeout) would wait out its timeout for n messages.
            first = consumer.poll(0.2)
            for message in [first, *consumer.consume(1000, 0)] if first is not None else []:
                error = message.error()
                if error is None:
                    key = message.key()
                    # A key that is not UTF-8 is no key of ours; it must not stop the reader.
                    name = key.decode(errors="replace") if key else ""
                    at = message.timestamp()[1]
                    newest.add(name, message.value(), message.partition() or 0, at)
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
                else:
                    raise KafkaUnavailableError(f"reading {topic} failed: {error.str()}")
        return list(newest.winners().items())
    finally:
        consumer.close()


def _not_empty(consumer: Any, tps: list[Any], deadline: float) -> set[int]:
    """The partitions of ``tps`` that hold messages, asked by ``time.monotonic()`` ``deadline``."""
    import time

    found = set()
    for tp in tps:
        low, high = consumer.get_watermark_offsets(
            tp, timeout=max(0.1, deadline - time.monotonic())
        )
        if high > low:
            found.add(tp.partition)
    return found
