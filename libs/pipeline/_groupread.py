"""What ``pipeline status`` reads from Kafka: group commits, group members, waiting heads.

Three reads, all without joining any group: the committed offsets of a consumer group
(``list_consumer_group_offsets``), its members with their partitions and hosts
(``describe_consumer_groups``), and the first waiting message of a partition, read with a plain
consumer assigned at the committed offset (its timestamp is how long the job has waited).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from ._clientlog import LastProblemLog
from ._errors import ConfigurationError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ._adminsession import AdminSession
    from ._settings import Settings

Where = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Member:
    """One member of a consumer group: its client id, host and assigned partitions."""

    member_id: str
    client_id: str
    host: str
    partitions: tuple[Where, ...]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group as its coordinator describes it (``state`` is ``DEAD`` or ``EMPTY``
    for a group with no member)."""

    group_id: str
    state: str
    members: tuple[Member, ...]


def committed_offsets(
    session: AdminSession, group: str, partitions: Iterable[Where]
) -> dict[Where, int | None]:
    """The group's committed offset of each partition; ``None`` where it committed nothing."""
    tps = [TopicPartition(topic, partition) for topic, partition in partitions]
    if not tps:
        return {}
    request = [ConsumerGroupTopicPartitions(group, tps)]
    futures = session.client.list_consumer_group_offsets(
        request, request_timeout=session.remaining()
    )
    answer = session.result(futures[group], f"list the committed offsets of group {group} in", None)
    found: dict[Where, int | None] = {}
    for tp in answer.topic_partitions:
        found[tp.topic, tp.partition] = tp.offset if tp.offset >= 0 else None
    return found


def describe_groups(session: AdminSession, groups: Iterable[str]) -> dict[str, GroupInfo]:
    """Each group's state and members (a group nobody ever joined is ``DEAD``, no members)."""
    wanted = list(dict.fromkeys(groups))
    futures = session.client.describe_consumer_groups(wanted, request_timeout=session.remaining())
    found = {}
    for group, future in futures.items():
        description = session.result(future, f"describe the consumer group {group} of", None)
        members = tuple(
            Member(
                member_id=m.member_id,
                client_id=m.client_id,
                host=m.host.lstrip("/"),
                partitions=tuple(
                    sorted((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
                ),
            )
            for m in description.members
        )
        state = getattr(description.state, "name", str(description.state))
        found[group] = GroupInfo(group, state, tuple(sorted(members, key=lambda m: m.client_id)))
    return found


def head_timestamps(
    settings: Settings, positions: Mapping[Where, int], timeout: float
) -> dict[Where, int]:
    """The timestamp (ms) of the first committed message at or after each position.

    A partition whose position is its end (or holds only transaction markers from there) is
    left out; so is one that gives nothing before ``timeout`` (the answer is a best effort).
    """
    if not positions:
        return {}
    conf: dict[str, Any] = {
        "group.id": f"{settings.namespace}.status-reader",  # required; never joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 20,
        "max.partition.fetch.bytes": 65536,
        **settings.client_config(),
        "logger": LastProblemLog(),
    }
    try:
        consumer = Consumer(conf)
    except KafkaException as exc:
        raise ConfigurationError(f"invalid Kafka client settings: {exc.args[0]}") from exc
    found: dict[Where, int] = {}
    try:
        pending = set(positions)
        consumer.assign([TopicPartition(t, p, offset) for (t, p), offset in positions.items()])
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(500, 0.05):
                where = (message.topic() or "", message.partition() or 0)
                if where not in pending:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(where)
                    continue
                _, stamp = message.timestamp()
                found[where] = stamp
                pending.discard(where)
                consumer.pause([TopicPartition(*where)])
    finally:
        consumer.close()
    return found
