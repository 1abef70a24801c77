"""A leader's term ends when a topic it reads gained partitions, so that the next reads them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from pipeline_scheduler._partitions import PartitionWatch


class Cluster:
    """What ``Consumer.list_topics`` answers: partition counts per topic, or an error."""

    def __init__(self, **counts: int) -> None:
        self.counts = counts
        self.asked = 0
        self.down = False

    def list_topics(self, timeout: float = -1) -> Any:
        self.asked += 1
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return SimpleNamespace(
            topics={
                topic: SimpleNamespace(error=None, partitions=dict.fromkeys(range(count)))
                for topic, count in self.counts.items()
            }
        )


def test_a_topic_that_gained_partitions_is_seen_at_the_next_check() -> None:
    clock = [0.0]
    cluster = Cluster(deferred=6, tier=6)
    watch = PartitionWatch({"deferred": 6, "tier": 6}, every_s=30.0, clock=lambda: clock[0])
    assert not watch.changed(cluster.list_topics)
    assert cluster.asked == 0  # not due yet: no request
    clock[0] = 30.0
    assert not watch.changed(cluster.list_topics)
    assert cluster.asked == 1
    cluster.counts["tier"] = 12
    clock[0] = 45.0
    assert not watch.changed(cluster.list_topics)  # seen only at the next check
    clock[0] = 60.0
    assert watch.changed(cluster.list_topics)


def test_metadata_that_cannot_be_read_changes_nothing() -> None:
    clock = [0.0]
    cluster = Cluster(deferred=12)
    cluster.down = True
    watch = PartitionWatch({"deferred": 6}, every_s=30.0, clock=lambda: clock[0])
    clock[0] = 30.0
    assert not watch.changed(cluster.list_topics)
    assert cluster.asked == 1
    cluster.down = False
    clock[0] = 60.0
    assert watch.changed(cluster.list_topics)  # asked again next time
