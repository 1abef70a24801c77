"""A subscribed topic the consumer reports missing stops the worker only once the cluster agrees."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ClusterMetadata, TopicMetadata

from pipeline._errors import TopicMissingError
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.intake.cluster import SHARE_RETRY_S, TOPIC_CHECK_RETRY_S, ClusterView

TOPICS = ["ns.jobs.critical", "ns.jobs.default"]


class Cluster:
    """Answers metadata requests for the topics in ``existing`` (or fails while ``down``)."""

    def __init__(self, existing: set[str]) -> None:
        self.existing = existing
        self.down = False
        self.asked: list[str] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        assert topic is not None
        self.asked.append(topic)
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"))
        metadata = ClusterMetadata()
        found = TopicMetadata()
        found.topic = topic
        if topic not in self.existing:
            found.error = KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
        metadata.topics[topic] = found
        return metadata


def view(cluster: Cluster) -> ClusterView:
    return ClusterView(
        cluster,  # type: ignore[arg-type]
        dict.fromkeys(TOPICS),
        {},
        WorkerMetrics(),
        "ns",
    )


def test_nothing_is_asked_without_a_hint() -> None:
    cluster = Cluster(set())
    view(cluster).check_topics(1.0)
    assert cluster.asked == []


def test_a_missing_topic_confirmed_by_the_cluster_names_it_and_the_fix() -> None:
    cluster = Cluster({"ns.jobs.critical"})
    watch = view(cluster)
    watch.topic_missing(1.0)
    with pytest.raises(TopicMissingError) as raised:
        watch.check_topics(1.0)
    assert raised.value.topics == ["ns.jobs.default"]
    assert str(raised.value) == (
        "topic ns.jobs.default does not exist; create the namespace's topics with "
        "`pipeline topics apply --namespace ns`"
    )


def test_a_hint_the_cluster_does_not_confirm_is_forgotten() -> None:
    """A broker that had not heard of a new topic yet: the others have."""
    cluster = Cluster(set(TOPICS))
    watch = view(cluster)
    watch.topic_missing(1.0)
    watch.check_topics(1.0)
    watch.check_topics(2.0)
    assert cluster.asked == TOPICS


def test_an_unanswered_check_is_tried_again_later() -> None:
    cluster = Cluster(set())
    cluster.down = True
    watch = view(cluster)
    watch.topic_missing(1.0)
    watch.check_topics(1.0)
    watch.check_topics(1.0 + TOPIC_CHECK_RETRY_S / 2)
    assert len(cluster.asked) == 1
    cluster.down = False
    with pytest.raises(TopicMissingError, match=r"topic ns\.jobs\.critical does not exist"):
        watch.check_topics(1.0 + TOPIC_CHECK_RETRY_S)


def test_a_partition_count_not_read_is_asked_again_until_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic answered with an error (a leader moving) was skipped and never asked again: a
    ``--burst`` worker, whose check waits for the count of every topic, never exited."""
    import time

    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    cluster = Cluster({"ns.jobs.critical"})
    watch = view(cluster)
    watch.share_changed = True  # assigned
    assert watch.share_due(now[0])
    _, counts = watch.share()
    assert "ns.jobs.default" not in counts
    assert watch.known_partition_counts() is None
    assert not watch.share_due(now[0])  # not at every turn of the consumer thread
    now[0] += SHARE_RETRY_S
    assert watch.share_due(now[0])
    cluster.existing.add("ns.jobs.default")
    watch.share()
    assert watch.known_partition_counts() == {"ns.jobs.critical": 0, "ns.jobs.default": 0}
    assert not watch.share_due(now[0] + 60)
