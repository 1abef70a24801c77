"""The relay's topic check: which leading rows of a batch go out, and what it says otherwise."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline._topiccheck import topic_name_problem
from pipeline.outbox._topicgate import TopicGate

INVALID_NAMES = [
    pytest.param("bad topic!", id="space-and-bang"),
    pytest.param("x" * 250, id="250-chars"),
    pytest.param("x" * 600, id="600-chars"),
    pytest.param(".", id="dot"),
    pytest.param("..", id="dot-dot"),
    pytest.param("", id="empty"),
    pytest.param("shop/jobs", id="slash"),
    pytest.param("jobs.défault", id="non-ascii"),
]


class _Cluster:
    """A metadata client that knows ``topics``; ``down``: it does not answer.

    Asked about a name Kafka refuses, it answers as confluent-kafka does: a name over 512
    characters raises librdkafka's ``RuntimeError`` before any request; another invalid name
    comes back from the broker with INVALID_TOPIC_EXCEPTION (librdkafka's TOPIC_EXCEPTION)."""

    def __init__(self, *topics: str, down: bool = False) -> None:
        self.topics = set(topics)
        self.down = down
        self.asked: list[str | None] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.asked.append(topic)
        if topic is not None and len(topic) > 512:
            raise RuntimeError(f'Unable to create topic object for "{topic}"')
        if self.down:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        if topic is not None and _kafka_refuses(topic):
            error = KafkaError(KafkaError.TOPIC_EXCEPTION)
            return SimpleNamespace(topics={topic: SimpleNamespace(error=error)})
        found = {t: SimpleNamespace(error=None) for t in self.topics if t == topic}
        return SimpleNamespace(topics=found)


def _kafka_refuses(name: str) -> bool:
    """The broker's own check (``Topic.validate``), written out apart from the code under test."""
    legal = re.fullmatch(r"[a-zA-Z0-9._-]{1,249}", name) is not None
    return not legal or name in (".", "..")


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


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "it is empty"),
        (".", "'.' is not allowed"),
        ("..", "'..' is not allowed"),
        ("x" * 250, "it is 250 characters long, more than 249"),
        ("bad topic!", "it holds ' ', '!'"),
        ("jobs.défault", "it holds 'é'"),
        ("a b\nc\td!e?f", "it holds '\\t', '\\n', ' ', '!', '?'"),
        ("a b\nc\td!e?f#", "it holds '\\t', '\\n', ' ', '!', '#', ..."),
    ],
)
def test_a_name_kafka_refuses_says_why(name: str, problem: str) -> None:
    assert topic_name_problem(name) == problem


@pytest.mark.parametrize("name", ["a", "shop.jobs.default", "x" * 249, "...", ".a", "A-Z_0.9"])
def test_a_name_kafka_takes_has_no_problem(name: str) -> None:
    assert topic_name_problem(name) is None


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_a_row_with_an_invalid_topic_name_waits_with_the_rows_after_it(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: a name over 512 characters raised librdkafka's RuntimeError out of the gate (the
    relay restarted every second); another came back with INVALID_TOPIC_EXCEPTION, was taken
    for a topic that exists and went out with its batch."""
    cluster = _Cluster("a")
    gate = TopicGate("pipeline_outbox", cluster)
    with caplog.at_level(logging.ERROR, logger="pipeline.outbox"):
        assert gate.passable(_rows("a", name, "a")) == 1
        assert gate.passable(_rows(name, "a")) == 0  # it still waits, first in the table
    assert name not in cluster.asked, "an invalid name is not looked up"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, "rate-limited: one line per topic per 30 s"
    assert errors[0].startswith(f"outbox row 2 is a job for {name[:80]!r}")
    assert f", which is not a valid Kafka topic name ({topic_name_problem(name)}; " in errors[0]
    assert "1 to 249 characters of a-z, A-Z, 0-9, '.', '_' and '-'" in errors[0]
    assert errors[0].endswith(
        "it and the rows after it wait in pipeline_outbox, in order, until the row's topic is "
        "fixed or the row is deleted"
    )
    assert "does not exist" not in errors[0]


def test_a_long_invalid_name_is_shortened_in_the_error(caplog: pytest.LogCaptureFixture) -> None:
    gate = TopicGate("pipeline_outbox", _Cluster())
    with caplog.at_level(logging.ERROR, logger="pipeline.outbox"):
        assert gate.passable(_rows("y" * 600)) == 0
    assert f"outbox row 1 is a job for {'y' * 80!r}..., which is not a valid" in caplog.text
    assert "y" * 81 not in caplog.text
    assert "it is 600 characters long, more than 249" in caplog.text


def test_an_invalid_name_waits_before_a_missing_topic_after_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = TopicGate("pipeline_outbox", _Cluster("a"))
    with caplog.at_level(logging.ERROR, logger="pipeline.outbox"):
        assert gate.passable(_rows("a", "no such topic", "missing")) == 1
    assert "outbox row 2 is a job for 'no such topic', which is not a valid" in caplog.text
    assert "missing" not in caplog.text


def test_a_missing_topic_before_an_invalid_name_is_what_the_error_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = TopicGate("pipeline_outbox", _Cluster("a"))
    with caplog.at_level(logging.ERROR, logger="pipeline.outbox"):
        assert gate.passable(_rows("a", "missing", "bad topic!")) == 1
    assert "outbox row 2 is a job for missing, which does not exist in Kafka" in caplog.text
    assert "not a valid" not in caplog.text


def test_an_invalid_name_waits_while_kafka_does_not_answer() -> None:
    """The rows before it go, for the batch's produce to report the outage; it does not."""
    gate = TopicGate("pipeline_outbox", _Cluster(down=True))
    assert gate.passable(_rows("a", "b", "bad topic!", "a")) == 2
    assert gate.passable(_rows("x" * 600, "a")) == 0


def test_a_fixed_row_goes_once_its_topic_is_valid() -> None:
    cluster = _Cluster("a", "shop.jobs.default")
    gate = TopicGate("pipeline_outbox", cluster)
    assert gate.passable(_rows("a", "shop jobs default", "a")) == 1
    assert gate.passable(_rows("shop.jobs.default", "a")) == 2


def test_a_topic_the_relay_may_not_describe_holds_its_row_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = _Cluster("ns.jobs.default")
    answer = cluster.list_topics

    def list_topics(topic: str | None = None, timeout: float = -1) -> Any:
        if topic == "ns.jobs.secret":  # asked by name, as Kafka answers an ACL's refusal
            error = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
            return SimpleNamespace(topics={topic: SimpleNamespace(error=error)})
        return answer(topic, timeout)

    cluster.list_topics = list_topics  # type: ignore[method-assign]
    gate = TopicGate("pipeline_outbox", cluster)
    with caplog.at_level(logging.ERROR, logger="pipeline.outbox"):
        assert gate.passable(_rows("ns.jobs.default", "ns.jobs.secret", "ns.jobs.default")) == 1
    assert "outbox row 2 is a job for ns.jobs.secret, which this relay may not describe" in (
        caplog.text
    )
