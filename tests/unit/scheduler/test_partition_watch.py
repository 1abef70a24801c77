"""A leader's term ends when a topic it reads gained partitions, so that the next reads them;
its start names a topic Kafka's ACLs hide."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import NotAuthorizedError
from pipeline_scheduler._partitions import PartitionWatch, term_partitions


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


class _Hidden:
    """Metadata in which Kafka's ACLs hide ``hidden`` from this client: left out of the
    listing, and TOPIC_AUTHORIZATION_FAILED when asked for by name."""

    def __init__(self, listed: dict[str, int], hidden: str) -> None:
        self._listed = listed
        self._hidden = hidden

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        if topic == self._hidden:
            refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
            return SimpleNamespace(topics={topic: SimpleNamespace(error=refused, partitions={})})
        topics = {
            name: SimpleNamespace(error=None, partitions=dict.fromkeys(range(n)))
            for name, n in self._listed.items()
        }
        return SimpleNamespace(topics=topics)


def test_a_topic_the_acls_hide_stops_the_term_naming_it() -> None:
    """The leader said "topics orders.deferred are not known to every broker yet" and tried
    again for good: delayed jobs never ran."""
    client = _Hidden({"orders.schedules": 1}, hidden="orders.deferred")
    with pytest.raises(NotAuthorizedError) as raised:
        term_partitions(client, ["orders.deferred", "orders.schedules"], "orders", user="sched")
    assert "Kafka user sched lacks READ on TOPIC orders.deferred" in str(raised.value)
    assert "--role scheduler" in str(raised.value)
