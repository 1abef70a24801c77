"""The rebalance callbacks under an eager assignor (classic protocol, ``range`` or ``roundrobin``).

The callbacks of :mod:`.rebalance` are written for incremental rebalances: they add what is
assigned with ``incremental_assign`` and give up what is revoked with ``incremental_unassign``.
An eager rebalance revokes the whole assignment, then assigns the whole new one, and librdkafka
refuses the incremental calls there. Within an eager round those calls mean exactly ``assign``
(nothing is assigned when the new assignment arrives) and ``unassign`` (all of it is revoked),
so the callbacks get a consumer that makes them so, and stay one piece of code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from confluent_kafka import Consumer, TopicPartition

Callback = Callable[["Consumer", list["TopicPartition"]], None]


class _EagerConsumer:
    """The consumer as an eager rebalance callback must use it; anything else is passed on."""

    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._consumer.assign(partitions)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._consumer.unassign()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def eager(callback: Callback) -> Callback:
    """``callback`` for an eager assignor (see the module docstring)."""

    def adapted(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        callback(cast("Consumer", _EagerConsumer(consumer)), partitions)

    return adapted
