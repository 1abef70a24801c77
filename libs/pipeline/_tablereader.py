"""Reading a table whole: every committed message of a compacted topic, beginning to end.

The ``<ns>.schedules`` table, the scheduler's state and the workers' heartbeats are read so.
Such a topic has one partition when ``pipeline topics apply`` creates it; one created otherwise
may have several, and a key's records may then be in more than one (partitions added after it
was written): within a partition the last record of a key wins, across partitions the newest by
timestamp (:func:`newest`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._clientlog import LastProblemLog
from ._errors import KafkaUnavailableError, TopicMissingError
from ._partitions import topic_partitions, unavailable

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = ["newest", "read_table", "replaces"]

Read = tuple[str, "bytes | None", int, int]
"""A record as read: its key, value, partition and timestamp (ms)."""


def replaces(partition: int, timestamp: int, known: tuple[int, int] | None) -> bool:
    """Whether a key's record read at ``partition`` with ``timestamp`` replaces the one
    ``known`` before it (its partition and timestamp; None: none): the next one of the same
    partition does, one of another partition when it is not older."""
    return known is None or known[0] == partition or known[1] <= timestamp


def newest(records: list[Read]) -> list[tuple[str, bytes | None]]:
    """The record of each key that wins, as (key, value), from ``records`` in the order they
    were read: the last of its partition, and of those of several partitions the newest by
    timestamp (a tie: the one read last)."""
    won: dict[str, Read] = {}
    for record in records:
        key, _, partition, timestamp = record
        known = won.get(key)
        if replaces(partition, timestamp, None if known is None else (known[2], known[3])):
            won.pop(key, None)  # in the order of the winners' reading
            won[key] = record
    return [(key, value) for key, value, _, _ in won.values()]


def read_table(
    settings: Settings, topic: str, timeout: float = 30.0, *, missing_ok: bool = False
) -> list[tuple[str, bytes | None]]:
    """Every committed message of ``topic`` from its beginning to its end, as (key, value) (of
    a topic of several partitions, each key's winning one: :func:`newest`); with
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
    consumer = Consumer(conf)
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
        records: list[Read] = []
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
                    records.append((name, message.value(), message.partition() or 0, at))
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
                else:
                    raise KafkaUnavailableError(f"reading {topic} failed: {error.str()}")
        return newest(records) if len(tps) > 1 else [(k, v) for k, v, _, _ in records]
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
