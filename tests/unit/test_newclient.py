"""Options librdkafka refuses when a client is made are a settings error naming them (exit 2
from the commands), not a ``KafkaException`` traceback."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer

from pipeline import ConfigurationError, Priority, Settings
from pipeline._newclient import client
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.intake.consumer import ConsumerThread

from .worker.test_worker_consumer import TOPIC, FakeSide, loop

__all__ = ["loop"]  # the fixture

NOWHERE = "127.0.0.1:9"


def test_an_option_librdkafka_does_not_have_is_named() -> None:
    with pytest.raises(ConfigurationError, match=r"^invalid Kafka client settings: No such conf"):
        client(Producer, {"bootstrap.servers": NOWHERE, "no.such.prop": "1"})


def test_the_worker_s_consumer_refusing_its_options_is_a_settings_error(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """`session.timeout.ms` under the consumer group protocol (the broker's, there): the
    worker's start ended with librdkafka's traceback, exit 1."""
    settings = Settings(
        bootstrap_servers=NOWHERE, worker={"kafka_consumer": {"session.timeout.ms": "6000"}}
    )
    with pytest.raises(ConfigurationError, match=r"session.timeout.ms. is not supported"):
        ConsumerThread(
            settings=settings,
            group_id="ns.workers",
            topics={TOPIC: (Priority.DEFAULT, 0)},
            side=FakeSide(loop),
            metrics=WorkerMetrics(),
            consumer_factory=Consumer,
        )


def test_an_enqueue_with_options_librdkafka_refuses_is_a_settings_error() -> None:
    from pipeline import Pipeline

    app = Pipeline(Settings(bootstrap_servers=NOWHERE, kafka={"no.such.prop": "1"}))
    with pytest.raises(ConfigurationError, match=r"no\.such\.prop"):
        app.enqueue("anything", {})


def test_a_command_exits_2_naming_the_option(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline_cli._main import cli

    result = CliRunner().invoke(
        cli,
        ["dlq", "ls", "--timeout", "1"],
        env={"PIPELINE_BOOTSTRAP_SERVERS": NOWHERE, "PIPELINE_KAFKA": '{"no.such.prop": "1"}'},
    )
    assert result.exit_code == 2, result.output
    assert 'invalid Kafka client settings: No such configuration property: "no.such.prop"' in (
        result.output
    )
