"""What the consumer's group options imply: how rebalances hand partitions over, and whether
partition p of every priority topic goes to one member (co-partitioning).

One idempotency key runs once across every priority (``worker.dedup_scope = "namespace"``)
because the job of a key lands on the same partition number p in each priority topic (producers
key it by the idempotency key and the topics have as many partitions) and the member that owns
p of every topic keeps one table of p's keys. That needs an assignor that co-partitions: the
range assignors do (librdkafka's classic ``range``, the broker's ``range`` under the consumer
protocol of KIP-848), cooperative-sticky, round-robin and the broker's ``uniform`` do not.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CO_PARTITIONING = "range"
"""The assignor name, classic or server-side, that gives partition p of each topic to one member."""


def consumer_protocol(conf: Mapping[str, Any]) -> bool:
    """Whether the consumer uses the group protocol of KIP-848 (``group.protocol=consumer``)."""
    return str(conf.get("group.protocol", "classic")).lower() == "consumer"


def _strategies(conf: Mapping[str, Any]) -> list[str]:
    """The classic protocol's assignment strategies (librdkafka's default: range, roundrobin)."""
    raw = str(conf.get("partition.assignment.strategy", "range,roundrobin"))
    return [s.strip().lower() for s in raw.split(",") if s.strip()]


def incremental(conf: Mapping[str, Any]) -> bool:
    """Whether a rebalance names only the partitions that move (``incremental_assign``), as
    under the consumer protocol and classic cooperative-sticky, or hands over the whole
    assignment each time (``assign``/``unassign``: the classic eager strategies)."""
    return consumer_protocol(conf) or "cooperative-sticky" in _strategies(conf)


def assignor(conf: Mapping[str, Any]) -> str:
    """The assignor the group will use, as the options name it (the first classic strategy:
    every member of a group lists the same ones)."""
    if consumer_protocol(conf):
        # Unset: the broker's first group.consumer.assignors, ``uniform`` by default.
        return str(conf.get("group.remote.assignor") or "uniform (the broker's default)")
    strategies = _strategies(conf)
    return strategies[0] if strategies else "range"


def copartitioning_problem(conf: Mapping[str, Any]) -> str | None:
    """Why these options do not co-partition the priority topics; None when they do."""
    name = assignor(conf)
    if name == CO_PARTITIONING:
        return None
    option = "group.remote.assignor" if consumer_protocol(conf) else "partition.assignment.strategy"
    return (
        f"the consumer group's assignor is {name}, which does not give partition p of every "
        f"priority topic to the same worker; one idempotency key across priorities "
        f'(worker.dedup_scope = "namespace") needs {option} = {CO_PARTITIONING}, or set '
        f'worker.dedup_scope = "priority" to deduplicate within each priority topic'
    )
