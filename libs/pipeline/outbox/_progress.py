"""Which rows the relay's last committed Kafka transaction held, kept in Kafka by that transaction.

Each batch's transaction ends with one record on the relay's own compacted topic
``<ns>.outbox-relay.<table>`` (one partition, created by the relay), keyed by the table, whose
value lists the ids of the batch's rows as ranges and a digest of their job ids
(``outbox-relay/2:17-512,530-1017;<digest>``). Kafka commits that record with the batch or not
at all. A relay that becomes active reads the last committed one back once it has registered
the transactional id (which aborted whatever its predecessor left open) and deletes those rows
if they are still there, all of them, holding the same jobs: rows of a batch Kafka committed but
whose delete never happened (a relay killed between the two commits) are not published a second
time. Rows that only share the ids (a database restored from a backup, or another database
whose relay wrote to the same topic) are left alone: the digest differs. Records of the first
format (``outbox-relay/1:``, ids only) are read as before, by ids alone.

A record, not an offset committed with the transaction (``send_offsets_to_transaction``): that
call can block past its timeout, for good, when the broker it cached as the group coordinator
went away (librdkafka issues 5456 and 5511), which a broker restart in the middle of a batch
did to the relay.

Creating the topic fails for good when Kafka refuses it for what it is: a name that collides with
an existing topic's once '.' and '_' are taken as one (tables ``billing.outbox`` and
``billing_outbox`` of one namespace), a config or a topic policy the cluster refuses. The relay
then stops with a :class:`~pipeline.ConfigurationError` naming the topic (exit code 2), instead
of trying again every few seconds for ever; an outage or a timeout is tried again.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .._errors import ConfigurationError
from .._newclient import client
from .._settings import Settings
from .._topiccheck import missing_topics
from ._dialect import Dialect, OutboxRow

__all__ = [
    "MARK",
    "MAX_RANGES",
    "CommittedBatch",
    "RelayProgress",
    "batch_digest",
    "decode_ids",
    "encode_ids",
    "progress_topic",
    "still_there",
]

_log = logging.getLogger("pipeline.outbox")

MARK = "outbox-relay/2:"
"""What a progress record starts with (the format's version)."""
_MARK_IDS_ONLY = "outbox-relay/1:"
"""The first format: the ids alone."""
_REFUSED_FOR_GOOD = {
    KafkaError.TOPIC_EXCEPTION: "its name is invalid, or collides with an existing topic's "
    "once '.' and '_' are taken as one: use another table name or namespace",
    KafkaError.INVALID_PARTITIONS: "create it beforehand: compacted, one partition",
    KafkaError.INVALID_CONFIG: "create it beforehand (compacted, one partition), or change the "
    "settings' topics options",
    KafkaError.POLICY_VIOLATION: "create it beforehand (compacted, one partition), or have the "
    "cluster's topic policy take it",
}
"""Refusals of the creation that trying again will not change, and what to do about each.
(INVALID_REPLICATION_FACTOR is tried again: Kafka answers it while brokers restart.)"""
MAX_RANGES = 10_000
"""The most id ranges a batch's record lists. A range is at most 40 characters (two 19-digit
ids, a dash, a comma), so a record is at most about 400 KB: well under the 1,000,000 bytes of
``message.max.bytes`` by default, with room for the transaction's framing."""


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    """The rows of the last batch a relay committed to Kafka: their ids, and the digest of
    their (id, job id) pairs (None in a record of the first format)."""

    ids: list[int]
    digest: str | None


def batch_digest(rows: Iterable[tuple[int, str]]) -> str:
    """A digest of (id, job id) pairs in id order: the same rows give the same digest."""
    text = "".join(f"{row_id} {job_id}\n" for row_id, job_id in rows)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def still_there(connection: Any, dialect: Dialect, table: str, batch: CommittedBatch) -> list[int]:
    """The ids of ``batch`` to delete from ``table``: all of them if its rows are all still
    there, holding the jobs it published; none otherwise (deleted already, or other rows under
    the same ids: a restored database, another database writing to the same progress topic)."""
    ids = batch.ids
    if not ids or batch.digest is None:
        return ids  # a record of the first format: ids alone
    wanted = set(ids)
    cursor = connection.cursor()
    try:
        cursor.execute(dialect.jobs_between(table), (ids[0], ids[-1]))
        found = [(row[0], row[1]) for row in cursor.fetchall() if row[0] in wanted]
    finally:
        cursor.close()
    connection.commit()
    if found and (len(found) != len(ids) or batch_digest(found) != batch.digest):
        _log.warning(
            "rows with the ids of the last batch Kafka committed (%d to %d) are in %s, but "
            "not the rows it held (a database restored from a backup, or another one whose "
            "relay uses the same table name in this namespace?): left to be published",
            ids[0],
            ids[-1],
            table,
        )
        return []
    return ids if found else []


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


MAX_IDS = 1_000_000
"""Most ids a progress record may name (a batch is far smaller); a record naming more is not
one a relay wrote, and expanding it could take all memory."""


def decode_ids(text: str) -> list[int]:
    """The ids of :func:`encode_ids`'s ranges; ValueError on anything else."""
    ids: list[int] = []
    for part in filter(None, text.split(",")):
        first, dash, last = part.partition("-")
        start, end = int(first), int(last) if dash else int(first)
        if end < start:
            raise ValueError(f"bad id range {part!r}")
        if len(ids) + end - start >= MAX_IDS:
            raise ValueError(f"more than {MAX_IDS} ids")
        ids.extend(range(start, end + 1))
    return ids


def progress_topic(namespace: str, table: str) -> str:
    """The relay's own topic for ``table``: ``<ns>.outbox-relay.<table>``."""
    return f"{namespace}.outbox-relay.{table}"


class RelayProgress:
    """The relay's progress record: written with each batch, read back when a relay takes over."""

    def __init__(self, settings: Settings, table: str) -> None:
        self.settings = settings
        self.topic = progress_topic(settings.namespace, table)
        self.key = table.encode()
        self._consumer = client(
            Consumer,
            {
                **settings.client_config(),
                "group.id": self.topic,  # never joined nor committed: reads by assignment
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 0,
            },
        )

    def ensure_topic(self, timeout: float) -> None:
        """Create the topic unless it exists (compacted: one live record per table). Raises
        :class:`ConfigurationError` when Kafka refuses it for good, :class:`KafkaException`
        when it may take it later (it does not answer in ``timeout``, among others).

        The topic is looked up first: Kafka checks the ``Create`` permission before it checks
        whether a topic exists, so a relay that may not create topics, whose topic was created
        beforehand, was refused for ever (TOPIC_AUTHORIZATION_FAILED, tried again)."""
        # Asked for by name, a topic Kafka may create (auto.create.topics.enable, the broker's
        # default) is made with the broker's defaults, unless the client says not to.
        admin = client(
            AdminClient,
            {**self.settings.client_config(), "log_level": 0, "allow.auto.create.topics": False},
        )
        if not missing_topics(admin, [self.topic], timeout):
            return
        t = self.settings.topics
        spec = NewTopic(
            self.topic,
            num_partitions=1,
            replication_factor=t.replication_factor,
            config={
                "cleanup.policy": "compact",
                "segment.ms": str(3_600_000),
                "min.cleanable.dirty.ratio": "0.1",
                "min.insync.replicas": str(t.effective_min_insync_replicas),
            },
        )
        future = admin.create_topics([spec], request_timeout=timeout)[self.topic]
        try:
            future.result(timeout)
        except TimeoutError as exc:  # concurrent.futures' (the built-in one since 3.11)
            error = KafkaError(KafkaError._TIMED_OUT, f"creating {self.topic} timed out")
            raise KafkaException(error) from exc
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return
            todo = _REFUSED_FOR_GOOD.get(error.code())
            if todo is not None:
                raise ConfigurationError(
                    f"Kafka refuses to create the outbox relay's topic {self.topic!r} "
                    f"({error.str()}): {todo}"
                ) from exc
            raise

    def value(self, rows: Sequence[OutboxRow]) -> bytes:
        """The record of the batch of ``rows`` (in id order)."""
        ids = encode_ids([row[0] for row in rows])
        return f"{MARK}{ids};{batch_digest((row[0], row[4]) for row in rows)}".encode()

    def last_committed(self, timeout: float) -> CommittedBatch:
        """The rows of the last batch a relay of this table committed (no ids: none yet).

        Reads back from the end of the topic, a window at a time. Raises
        :class:`KafkaException` when Kafka does not answer within ``timeout``."""
        deadline = time.monotonic() + timeout
        partition = TopicPartition(self.topic, 0)
        low, end = self._consumer.get_watermark_offsets(partition, timeout=timeout)
        window = 16
        while end > low:
            start = max(low, end - window)
            found = self._read(start, end, deadline)
            if found is not None:
                return parse_record(found)
            end, window = start, window * 4
        return CommittedBatch([], None)

    def _read(self, start: int, end: int, deadline: float) -> str | None:
        """The value of the last record for this table in offsets ``[start, end)``."""
        consumer = self._consumer
        consumer.assign([TopicPartition(self.topic, 0, start)])
        last: str | None = None
        try:
            while True:
                for message in consumer.consume(500, timeout=0.2):
                    if message.error() is not None:
                        raise KafkaException(message.error())
                    value = message.value() or b""
                    ours = (message.offset() or 0) < end and message.key() == self.key
                    if ours and value.startswith((MARK.encode(), _MARK_IDS_ONLY.encode())):
                        last = value.decode()
                [position] = consumer.position([TopicPartition(self.topic, 0)])
                if position.offset >= end:
                    return last
                if time.monotonic() > deadline:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, f"reading {self.topic} timed out")
                    )
        finally:
            consumer.unassign()

    def close(self) -> None:
        self._consumer.close()


def parse_record(text: str) -> CommittedBatch:
    """The batch a progress record names; ValueError if it is not one."""
    if text.startswith(_MARK_IDS_ONLY):
        return CommittedBatch(decode_ids(text.removeprefix(_MARK_IDS_ONLY)), None)
    ids, semicolon, digest = text.removeprefix(MARK).partition(";")
    if not text.startswith(MARK) or not semicolon or not digest:
        raise ValueError(f"not an outbox relay progress record: {text[:80]!r}")
    return CommittedBatch(decode_ids(ids), digest)
