"""Options librdkafka refuses when a client is made are a settings error naming them (exit 2
from the commands), not a ``KafkaException`` traceback."""

from __future__ import annotations

import ast
import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer

from pipeline import ConfigurationError, Priority, Settings
from pipeline._codec import JobCodec
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


def test_a_tls_file_that_does_not_exist_is_named_with_its_setting(tmp_path: Path) -> None:
    """librdkafka says only ``ssl.ca.location failed: error:05880020:x509 ...BIO lib``."""
    missing = tmp_path / "ca.pem"
    with pytest.raises(ConfigurationError) as caught:
        client(Producer, {"bootstrap.servers": NOWHERE, "ssl.ca.location": str(missing)})
    assert str(caught.value) == (
        f"invalid Kafka client settings: ssl.ca.location {missing} does not exist (set by "
        "security.ssl_ca_location, PIPELINE_SECURITY__SSL_CA_LOCATION, or the kafka options)"
    )
    with pytest.raises(ConfigurationError, match="PIPELINE_SECURITY__SSL_KEY_LOCATION"):
        client(Producer, {"bootstrap.servers": NOWHERE, "ssl.key.location": str(missing)})


def test_a_ca_directory_and_the_system_s_bundle_are_taken(tmp_path: Path) -> None:
    for ca in (str(tmp_path), "probe"):
        client(Producer, {"bootstrap.servers": NOWHERE, "ssl.ca.location": ca})


@pytest.mark.parametrize("service", ["moves", "relay", "events", "beats"])
def test_every_client_of_the_worker_names_a_missing_ca(
    service: str, loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """The worker's transactional producer was made without :func:`client`: a missing CA file
    ended the worker with librdkafka's traceback (exit 1), and ``--processes`` restarted it
    for good. Each client the worker makes goes through it now."""
    from pipeline_worker._beats import Heartbeats
    from pipeline_worker.commit.moves import Mover
    from pipeline_worker.recovery.relay import RetryRelay
    from pipeline_worker.route.events import EventStream

    settings = Settings(
        bootstrap_servers=NOWHERE,
        security={"protocol": "SSL", "ssl_ca_location": str(tmp_path / "ca.pem")},
    )
    make: Callable[[], object] = {
        "moves": lambda: Mover(settings, loop),
        "relay": lambda: RetryRelay(settings, "ns.relay", WorkerMetrics(), print),
        "events": lambda: EventStream(settings, JobCodec(), WorkerMetrics()),
        "beats": lambda: Heartbeats(
            settings,
            client_id="w",
            group="ns.workers",
            counters=None,  # type: ignore[arg-type]
        ),
    }[service]
    with pytest.raises(ConfigurationError, match=r"ssl\.ca\.location .* does not exist"):
        make()


def test_every_client_is_made_through_client() -> None:
    """A client made directly (``Producer(conf)``) turns a bad option or a missing TLS file
    into librdkafka's traceback again: each one goes through :func:`client`."""
    root = Path(__file__).resolve().parents[2]
    direct = []
    for path in [*root.glob("libs/**/*.py"), *root.glob("services/**/*.py")]:
        if path.name == "_newclient.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"Producer", "Consumer", "AdminClient"}
            ):
                direct.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not direct, f"clients made without pipeline._newclient.client: {direct}"
