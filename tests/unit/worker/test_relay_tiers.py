"""The retry tiers the relay reads: the configured ones, then those left on the cluster."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import Settings
from pipeline._errors import TopicMissingError
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.recovery import relay as relay_module
from pipeline_worker.recovery.tiers import Tiers
from tests.unit.test_transactions import FakeProducer


class Cluster:
    """Answers ``list_topics`` as a cluster with ``names``; raises while ``down``."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)
        self.down = 0

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        if self.down:
            self.down -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        shown = self.names if topic is None else {topic} & self.names
        topics = {name: SimpleNamespace(error=None) for name in shown}
        if topic is not None and topic not in self.names:
            topics[topic] = SimpleNamespace(error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
        return SimpleNamespace(topics=topics)


SETTINGS = Settings(namespace="ns", topics={"retry_delays_s": [1, 10]})


def test_left_over_tiers_follow_the_configured_ones_in_their_order() -> None:
    cluster = Cluster(
        *("ns.retry.0", "ns.retry.1", "ns.retry.10", "ns.retry.2"),
        *("ns.retry.01", "ns.retry.x", "ns.retry.3.old", "other.retry.5", "ns.deferred"),
    )
    tiers = Tiers(SETTINGS, cluster)
    assert tiers.left_over() == ["ns.retry.2", "ns.retry.10"]
    assert tiers.to_read(lambda _: False) == [
        "ns.retry.0",
        "ns.retry.1",
        "ns.retry.2",
        "ns.retry.10",
    ]


def test_the_cluster_is_asked_again_until_it_answers_or_a_stop_comes() -> None:
    cluster = Cluster("ns.retry.0", "ns.retry.1", "ns.retry.5")
    cluster.down = 2
    waits: list[float] = []

    def stopped(seconds: float) -> bool:
        waits.append(seconds)
        return False

    tiers = Tiers(SETTINGS, cluster)
    assert tiers.to_read(stopped) == ["ns.retry.0", "ns.retry.1", "ns.retry.5"]
    assert waits == [1.0, 1.0]
    cluster.down = 1
    assert tiers.to_read(lambda _: True) is None


def test_only_a_configured_tier_missing_stops_the_relay() -> None:
    Tiers(SETTINGS, Cluster("ns.retry.0", "ns.retry.1")).check()  # a left-over tier deleted
    with pytest.raises(TopicMissingError, match=r"ns\.retry\.1"):
        Tiers(SETTINGS, Cluster("ns.retry.0", "ns.retry.7")).check()


def test_a_relay_with_no_tier_configured_nor_on_the_cluster_ends_before_it_joins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started whatever the settings name (the cluster may hold tiers of an earlier
    configuration), a relay that finds no tier neither registers its transactional id nor
    joins its group."""
    cluster = Cluster("ns.jobs.default", "ns.deferred", "other.retry.0")
    subscribed: list[object] = []
    cluster.subscribe = lambda topics, **_: subscribed.append(topics)  # type: ignore[attr-defined]
    cluster.close = lambda: None  # type: ignore[attr-defined]
    producer = FakeProducer()
    monkeypatch.setattr(relay_module, "Consumer", lambda conf: cluster)
    monkeypatch.setattr(relay_module, "Producer", lambda conf: producer)
    failed: list[BaseException] = []
    settings = Settings(namespace="ns", topics={"retry_delays_s": []})
    relay = relay_module.RetryRelay(settings, "ns.workers", WorkerMetrics(), failed.append)
    relay._main()  # its thread's whole run: it returns
    assert (subscribed, failed) == ([], [])
    assert "init_transactions" not in producer.calls
