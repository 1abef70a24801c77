"""How much work waits in a namespace, read from Kafka alone (no worker or scheduler needed).

Per partition of each topic that a consumer group works off: the end offset minus that group's
committed offset (the earliest retained offset where it committed nothing), and the write time
of the first message not committed (the oldest job still waiting or running), read with a plain
consumer assigned there in ``read_committed`` mode. That read skips what no worker runs, the
messages of aborted transactions and the transaction markers, so those ahead of the first job
do not count (a partition holding only them from there has no backlog and no oldest). The
groups are the workers' (priority topics), the workers' retry relay (retry tiers) and the
scheduler leader's (``<ns>.deferred`` and its wait tiers). The tiers are
the ``<ns>.retry.<n>`` and ``<ns>.deferred.<n>`` topics found on the cluster, so a reader whose
settings name other tiers than the services' still sees them all. Dead letters
pending are those neither replayed nor discarded. Members of the workers' and the schedulers'
groups come from the group coordinator.

:class:`BacklogReader` keeps its Kafka clients between reads, for a process that reads every
few seconds (``pipeline exporter``, ``pipeline status --watch``); one read is one
:class:`~._backlogmodel.Backlog`. ``pipeline status`` adds what only it shows on top
(:mod:`._status`).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    TopicPartition,
)

from ._adminsession import AdminSession, PartitionOffsets, has_code
from ._backlogmodel import Backlog, GroupMember, GroupMembers, PartitionBacklog, TopicBacklog
from ._clientlog import LastProblemLog
from ._deadletters import DlqStats, dlq_stats, read_dead_letters
from ._errors import (
    KafkaUnavailableError,
    NotAuthorizedError,
    TopicAdminError,
    TopicMissingError,
)
from ._job import Priority
from ._newclient import client
from ._topiccheck import not_authorized
from ._topics import TopicNames, deferred_group, retry_group, scheduler_group, worker_group

if TYPE_CHECKING:
    from ._settings import Settings

_NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group committed nothing there


@dataclass(frozen=True, slots=True)
class _Head:
    """Where a ``read_committed`` read from a partition's position found its first message."""

    offset: int
    written_ms: int | None
    """``None`` when it found none (``offset`` is where the read ended) or the message carries
    no timestamp."""


DeadLetterCounter = Callable[[float], DlqStats]
"""Counts the dead letters within the seconds given (a :class:`BacklogReader` source)."""


def _read_dead_letters(settings: Settings, timeout: float) -> DlqStats:
    return dlq_stats(read_dead_letters(settings, timeout=timeout))


class BacklogReader:
    """Reads :class:`Backlog` snapshots; each :meth:`read` takes at most ``timeout`` seconds.

    ``dead_letters`` counts the dead letters; by default each read reads ``<ns>.dlq`` whole
    (seconds for a deep one). A process that keeps a
    :class:`~pipeline._deadletters.LetterIndex` passes its counts instead.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        timeout: float = 10.0,
        dead_letters: DeadLetterCounter | None = None,
    ) -> None:
        self.settings = settings
        self.timeout = timeout
        self._dead_letters = dead_letters or functools.partial(_read_dead_letters, settings)
        names = TopicNames(settings.namespace)
        self._jobs = {p.value: names.jobs(p) for p in Priority}
        self._deferred = names.deferred
        self._roles = {"worker": worker_group(settings), "scheduler": scheduler_group(settings)}
        self._admin = AdminSession(settings, timeout)
        conf: dict[str, Any] = {
            "group.id": f"{settings.namespace}.backlog-reader",  # required; never joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",  # what the workers see
            "fetch.wait.max.ms": 20,
            # A position deleted under the read (retention, delete-records) reads on from the
            # new start, as the workers do; librdkafka's default (latest) would skip every job.
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 65536,  # one message is enough
            **settings.client_config(),
            "logger": LastProblemLog(),
        }
        self._consumer = client(Consumer, conf)

    def read(self) -> Backlog:
        """One snapshot. Raises :class:`KafkaUnavailableError` when Kafka does not answer in
        time, :class:`TopicMissingError` when the namespace's topics do not exist and
        :class:`NotAuthorizedError` when Kafka's ACLs refuse this client one of them.

        After a read Kafka did not answer, the next one asks with a new admin client: one kept
        across a broker restart may never hear from a group coordinator again (librdkafka keeps
        asking the one it cached: confluentinc/librdkafka#5511), and the dashboard and the
        exporter, which read for as long as they run, said "Kafka cannot be read" for good."""
        try:
            return self._read()
        except KafkaUnavailableError:
            self._admin = AdminSession(self.settings, self.timeout)
            raise

    def _read(self) -> Backlog:
        self._admin.restart_deadline()
        read_at = time.time()
        metadata = self._admin.metadata()
        missing = [t for t in (*self._jobs.values(), self._deferred) if t not in metadata.topics]
        if missing:
            self._check_described(missing)
            raise TopicMissingError(missing, self.settings.namespace)
        ns = re.escape(self.settings.namespace)
        retries = _numbered(metadata.topics, rf"{ns}\.retry\.(\d+)")
        deferred = [self._deferred, *_numbered(metadata.topics, rf"{ns}\.deferred\.(\d+)")]
        groups = {
            **dict.fromkeys(self._jobs.values(), worker_group(self.settings)),
            **dict.fromkeys(retries, retry_group(self.settings)),
            **dict.fromkeys(deferred, deferred_group(self.settings)),
        }
        # Commits first: an end listed before them could be passed by a commit made meanwhile,
        # which would look out of range (see PartitionBacklog.position).
        committed = self._committed(metadata, groups)
        offsets = self._admin.offsets(metadata, groups)
        starts = [
            TopicPartition(name, p.partition, p.position)
            for name in groups
            for p in (self._partition(name, o, committed, {}) for o in offsets[name])
            if p.waiting > 0
        ]
        heads = self._heads(starts)

        def topic(name: str) -> TopicBacklog:
            parts = tuple(self._partition(name, o, committed, heads) for o in offsets[name])
            return TopicBacklog(name, groups[name], parts)

        return Backlog(
            read_at=read_at,
            jobs={priority: topic(name) for priority, name in self._jobs.items()},
            retries=tuple(topic(name) for name in retries),
            deferred=tuple(topic(name) for name in deferred),
            dead_letters=self._dead_letters(self._admin.remaining()),
            groups=self._members(),
        )

    @staticmethod
    def _partition(
        topic: str,
        offsets: PartitionOffsets,
        committed: dict[tuple[str, int], int],
        heads: dict[tuple[str, int], _Head],
    ) -> PartitionBacklog:
        where = (topic, offsets.partition)
        head = heads.get(where)
        return PartitionBacklog(
            offsets.partition,
            offsets.start,
            offsets.end,
            committed.get(where),
            None if head is None else head.written_ms,
            None if head is None else head.offset,
        )

    def _check_described(self, missing: list[str]) -> None:
        """Raise :class:`NotAuthorizedError` if Kafka refuses to describe one of ``missing``
        to this client: a topic it may not see is missing from the listing too."""
        for topic in missing:
            if not_authorized(self._admin.client, topic, max(0.5, self._admin.remaining())):
                user = self.settings.security.sasl_username
                raise NotAuthorizedError("TOPIC", topic, "DESCRIBE", user)

    def _committed(self, metadata: Any, groups: dict[str, str]) -> dict[tuple[str, int], int]:
        by_group: dict[str, list[TopicPartition]] = {}
        for name, group in groups.items():
            by_group.setdefault(group, []).extend(
                TopicPartition(name, p) for p in sorted(metadata.topics[name].partitions)
            )
        found: dict[tuple[str, int], int] = {}
        client = self._admin.client

        def listed(group: str, tps: list[TopicPartition]) -> list[TopicPartition]:
            request = [ConsumerGroupTopicPartitions(group, tps)]
            futures = client.list_consumer_group_offsets(
                request, request_timeout=self._admin.remaining()
            )
            doing = f"list the committed offsets of group {group}"
            try:
                return list(self._admin.result(futures[group], doing, None).topic_partitions)
            except TopicAdminError as exc:
                if has_code(exc.__cause__, KafkaError.GROUP_AUTHORIZATION_FAILED):
                    user = self.settings.security.sasl_username
                    raise NotAuthorizedError("GROUP", group, "DESCRIBE", user, "operator") from exc
                raise

        for group, tps in by_group.items():
            for tp in self._admin.retry(functools.partial(listed, group, tps)):
                if tp.error is None and tp.offset != _NO_OFFSET and tp.offset >= 0:
                    found[tp.topic, tp.partition] = tp.offset
        return found

    def _members(self) -> dict[str, GroupMembers]:
        client = self._admin.client
        futures = client.describe_consumer_groups(
            list(self._roles.values()), request_timeout=self._admin.remaining()
        )
        groups: dict[str, GroupMembers] = {}
        for role, group in self._roles.items():
            doing = f"describe the consumer group {group} of"
            described = self._admin.result(futures[group], doing, None)
            members = sorted(
                (
                    GroupMember(
                        m.client_id,
                        m.host.lstrip("/"),  # librdkafka's "/10.0.0.7"
                        tuple(
                            sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
                        )
                        if m.assignment is not None
                        else (),
                        m.member_id,
                    )
                    for m in described.members
                ),
                key=lambda m: m.client_id,
            )
            state = getattr(described.state, "name", str(described.state))
            groups[role] = GroupMembers(group, state, tuple(members))
        return groups

    def _heads(self, starts: list[TopicPartition]) -> dict[tuple[str, int], _Head]:
        """The first committed message at or after each start position (see :class:`_Head`)."""
        found: dict[tuple[str, int], _Head] = {}
        if not starts:
            return found
        todo = {(tp.topic, tp.partition) for tp in starts}
        paused: list[TopicPartition] = []
        self._consumer.assign(starts)
        try:
            while todo:
                if self._admin.remaining() <= 0.1:
                    raise KafkaUnavailableError(
                        f"Kafka at {self.settings.bootstrap_servers} did not deliver the oldest "
                        f"waiting job of {len(todo)} partition(s) within {self.timeout:g}s; "
                        "check the brokers' health"
                    )
                for message in self._consumer.consume(500, 0.05):
                    where = (message.topic() or "", message.partition() or 0)
                    error = message.error()
                    if error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                        # Refused, not slow: waiting out the timeout cannot change that.
                        topic = where[0] or ", ".join(sorted({t for t, _ in todo}))
                        user = self.settings.security.sasl_username
                        raise NotAuthorizedError("TOPIC", topic, "READ", user)
                    if where not in todo:
                        continue
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            # only markers and aborted messages were left (or an open
                            # transaction's, which the read stops before and keeps counting)
                            found[where] = _Head(message.offset() or 0, None)
                            todo.discard(where)
                        continue
                    kind, stamp = message.timestamp()
                    # No timestamp (a client on the v0 message format writes -1): the age is
                    # unknown, not 56 years.
                    known = kind != TIMESTAMP_NOT_AVAILABLE and stamp >= 0
                    found[where] = _Head(message.offset() or 0, stamp if known else None)
                    todo.discard(where)
                    paused.append(TopicPartition(*where))  # one message is all it needs
                    self._consumer.pause(paused[-1:])
        finally:
            self._consumer.resume(paused)  # a pause outlives unassign: the next read needs them
            self._consumer.unassign()
        return found

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> BacklogReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _numbered(topics: Iterable[str], pattern: str) -> list[str]:
    """The topics named ``pattern`` (one number in it), in the order of their numbers."""
    found = [(int(m[1]), name) for name in topics if (m := re.fullmatch(pattern, name))]
    return [name for _, name in sorted(found)]


def read_backlog(settings: Settings, *, timeout: float = 10.0) -> Backlog:
    """One snapshot of the namespace's backlog (see :class:`BacklogReader`)."""
    with BacklogReader(settings, timeout=timeout) as reader:
        return reader.read()
