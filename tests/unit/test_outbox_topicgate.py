"""The relay's topic check: which leading rows of a batch go out, and what it says otherwise."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline.outbox._topicgate import TopicGate


class _Cluster:
    """A metadata client that knows ``topics``; ``down``: it does not answer."""

    def __init__(self, *topics: str, down: bool = False) -> None:
        self.topics = set(topics)
        self.down = down
        self.asked: list[str | None] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.asked.append(topic)
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        found = {t: SimpleNamespace(error=None) for t in self.topics if t == topic}
        return SimpleNamespace(topics=found)


def _rows(*topics: str) -> list[tuple[int, str, bytes | None, bytes, str]]:
    return [(i, topic, None, b"v", f"job-{i}") for i, topic in enumerate(topics, start=1)]


def test_rows_up_to_the_first_of_a_missing_topic_pass(caplog: pytest.LogCaptureFixture) -> None:
    cluster = _Cluster("a", "b")
    gate = TopicGate("pipeline_outbox", cluster)
    assert gate.passable(_rows("a", "b", "a")) == 3
    with caplog.at_level(logging.ERROR, logger="pipeline.outbox"):
        assert gate.passable(_rows("a", "b", "c", "a")) == 2
    assert "outbox row 3 is a job for c, which does not exist in Kafka" in caplog.text
    assert gate.passable(_rows("c")) == 0
    cluster.topics.add("c")
    assert gate.passable(_rows("c", "a")) == 2


def test_a_topic_found_is_not_asked_about_again() -> None:
    cluster = _Cluster("a")
    gate = TopicGate("pipeline_outbox", cluster)
    assert gate.passable(_rows("a")) == 1
    asked = len(cluster.asked)
    assert gate.passable(_rows("a", "a")) == 2
    assert len(cluster.asked) == asked


def test_kafka_not_answering_lets_the_batch_go_to_report_the_outage() -> None:
    gate = TopicGate("pipeline_outbox", _Cluster(down=True))
    assert gate.passable(_rows("a", "b")) == 2
