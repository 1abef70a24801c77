"""What a fault needs to know of a replicated local cluster: which node coordinates the worker
group, which node is the active KRaft controller, and when every replica is back in sync."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.waiting import wait_for

if TYPE_CHECKING:
    from pipeline import Settings
    from pipeline_cli.devbroker import DevCluster

REPLICATED_TOPICS = {"partitions": 4, "replication_factor": 3, "min_insync_replicas": 2}
"""The namespace's topics in these tests: 3 replicas, acks=all needs 2 of them in sync."""


def _admin(settings: Settings) -> AdminClient:
    return AdminClient({**settings.client_config(), "log_level": 0})


def coordinator(settings: Settings, group: str, timeout: float = 60) -> int:
    """The node id of ``group``'s coordinator (its ``__consumer_offsets`` partition's leader)."""
    admin = _admin(settings)
    found: list[int] = []
    problems: list[Exception] = []

    def answered() -> bool:
        try:
            description = admin.describe_consumer_groups([group], request_timeout=10)[group]
            found.append(description.result(timeout=15).coordinator.id)
        except KafkaException as exc:
            problems.append(exc)
            return False
        return True

    if not wait_for(answered, timeout, interval=0.5):
        raise AssertionError(f"no coordinator of {group} within {timeout:g}s: {problems[-1:]}")
    return found[-1]


def active_controller(cluster: DevCluster) -> int:
    """The node id of the KRaft quorum's leader, as the running nodes last recorded it.

    Each voter writes the leader it follows and the epoch to ``quorum-state`` at every election;
    the highest epoch's leader among the running nodes is the active controller. (Brokers'
    DescribeCluster answers name a random broker as controller in KRaft mode, not the leader.)
    """
    best: tuple[int, int] | None = None
    for node in cluster.nodes:
        if node.pid() is None:
            continue
        state_file = node.data_path / "__cluster_metadata-0" / "quorum-state"
        state = json.loads(state_file.read_text())
        epoch, leader = int(state["leaderEpoch"]), int(state["leaderId"])
        if leader >= 0 and (best is None or epoch > best[0]):
            best = (epoch, leader)
    if best is None:
        raise AssertionError(f"no running node of {cluster.data_dir} knows a quorum leader")
    return best[1]


def out_of_sync(settings: Settings) -> list[str]:
    """Partitions (all topics, internal ones too) without a leader or with a replica not in sync."""
    metadata = _admin(settings).list_topics(timeout=10)
    problems = []
    for topic in metadata.topics.values():
        for partition in topic.partitions.values():
            if partition.leader < 0 or set(partition.isrs) != set(partition.replicas):
                problems.append(
                    f"{topic.topic}[{partition.id}] leader {partition.leader} "
                    f"isr {sorted(partition.isrs)} of {sorted(partition.replicas)}"
                )
    return problems


def wait_in_sync(settings: Settings, timeout: float = 120) -> None:
    """Wait until every partition has a leader and all its replicas in sync."""
    seen: list[list[str]] = []

    def in_sync() -> bool:
        try:
            seen.append(out_of_sync(settings))
        except KafkaException as exc:
            seen.append([str(exc)])
        return not seen[-1]

    if not wait_for(in_sync, timeout, interval=0.5):
        problems = seen[-1]
        raise AssertionError(
            f"{len(problems)} partition(s) not in sync after {timeout:g}s: {problems[:5]}"
        )
