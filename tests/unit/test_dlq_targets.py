"""``pipeline dlq replay --to-topic``: which topics of the namespace it refuses, without Kafka."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipeline_cli._main import cli

UNREACHABLE = ["--namespace", "ns", "--bootstrap-servers", "127.0.0.1:1", "--timeout", "0.5"]


@pytest.mark.parametrize(
    "topic",
    [
        "ns.dlq",
        "ns.events",
        "ns.scheduler-control",  # the schedulers' leadership: nothing reads its records
        "ns.outbox-relay.pipeline_outbox",  # an outbox relay's progress
    ],
)
def test_a_topic_of_the_namespace_that_holds_no_jobs_is_refused(topic: str) -> None:
    result = CliRunner().invoke(cli, ["dlq", "replay", "--to-topic", topic, "--yes", *UNREACHABLE])
    assert result.exit_code == 2, result.output
    assert f"{topic} holds no jobs" in result.output


@pytest.mark.parametrize(
    "topic", ["ns.jobs.high", "ns.retry.1", "ns.deferred", "other.jobs.default", "ns.outbox"]
)
def test_a_topic_that_may_hold_jobs_is_taken(topic: str) -> None:
    result = CliRunner().invoke(cli, ["dlq", "replay", "--to-topic", topic, "--yes", *UNREACHABLE])
    assert result.exit_code == 1, result.output  # it went on to read Kafka, which is not there
    assert "did not answer" in result.output


@pytest.mark.parametrize(
    ("topic", "says"), [("bad topic!", "it holds ' ', '!'"), ("..", "'..' is not allowed")]
)
def test_a_name_kafka_refuses_is_refused_before_anything_is_read(topic: str, says: str) -> None:
    """A dry run said "would replay 5 dead letters to bad topic!" and exited 0."""
    result = CliRunner().invoke(
        cli, ["dlq", "replay", "--to-topic", topic, "--dry-run", *UNREACHABLE]
    )
    assert result.exit_code == 2, result.output
    assert f"{topic!r} is not a topic name: {says}" in result.output
