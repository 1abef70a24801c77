"""Creating the relay's progress topic: a refusal for good stops the relay (no broker: a fake
admin client).

Kafka refuses a topic whose name collides with an existing one once '.' and '_' are taken as one
(tables ``billing.outbox`` and ``billing_outbox`` of one namespace) with INVALID_TOPIC_EXCEPTION,
not TOPIC_ALREADY_EXISTS: the relay tried again every 2 s, for ever ("cannot read the last
committed batch ... trying again"). A creation that did not end in time raised the built-in
``TimeoutError``, which went past the relay's retry.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException

from pipeline import ConfigurationError, Settings
from pipeline.outbox import OutboxRelay, RelayOptions, create_table
from pipeline.outbox import _progress as progress_module
from pipeline.outbox._dialect import SQLITE
from pipeline.outbox._progress import RelayProgress
from pipeline_cli import _outbox as outbox_cli
from pipeline_cli._main import cli
from tests.unit.test_transactions import FakeProducer

SETTINGS = Settings(bootstrap_servers="127.0.0.1:1", namespace="unit")
TOPIC = "unit.outbox-relay.billing_outbox"
COLLISION = KafkaError(
    KafkaError.TOPIC_EXCEPTION,
    f"Topic '{TOPIC}' collides with existing topic: unit.outbox-relay.billing.outbox",
)
FOR_GOOD = [
    pytest.param(COLLISION, "collides with existing topic", id="collision"),
    pytest.param(
        KafkaError(KafkaError.INVALID_CONFIG, "Invalid value compact for cleanup.policy"),
        "Invalid value compact",
        id="invalid-config",
    ),
    pytest.param(
        KafkaError(KafkaError.POLICY_VIOLATION, "Topic names must start with 'team-'"),
        "must start with 'team-'",
        id="policy-violation",
    ),
    pytest.param(
        KafkaError(KafkaError.INVALID_PARTITIONS, "Number of partitions must be larger than 0"),
        "Number of partitions",
        id="invalid-partitions",
    ),
]
TRANSIENT = [
    pytest.param(KafkaError(KafkaError._TRANSPORT, "Broker transport failure"), id="transport"),
    pytest.param(KafkaError(KafkaError._TIMED_OUT, "Request timed out"), id="timed-out"),
    pytest.param(
        KafkaError(KafkaError.INVALID_REPLICATION_FACTOR, "only 2 broker(s) are registered"),
        id="brokers-restarting",
    ),
    pytest.param(
        KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed"),
        id="acl",
    ),
]


class _Future:
    def __init__(self, outcome: BaseException | None) -> None:
        self._outcome = outcome

    def result(self, timeout: float | None = None) -> None:
        if self._outcome is not None:
            raise self._outcome


class _Admin:
    """An admin client whose topic creations end as ``outcomes`` says, one per call (then
    created); asked once more than ``last``, it ends the test (``_Looped``)."""

    outcomes: ClassVar[list[BaseException | None]] = []
    asked: ClassVar[list[str]] = []
    existing: ClassVar[set[str]] = set()
    last = 10

    def __init__(self, conf: dict[str, Any]) -> None: ...

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> SimpleNamespace:
        return SimpleNamespace(topics={name: SimpleNamespace(error=None) for name in self.existing})

    def create_topics(self, specs: list[Any], request_timeout: float = -1) -> dict[str, _Future]:
        [spec] = specs
        _Admin.asked.append(spec.topic)
        if len(_Admin.asked) > _Admin.last:
            raise _Looped(f"asked to create {spec.topic} {len(_Admin.asked)} times")
        outcome = _Admin.outcomes.pop(0) if _Admin.outcomes else None
        return {spec.topic: _Future(outcome)}


class _Looped(BaseException):
    """Past the relay's ``except Exception``: a relay that tries for ever ends the test."""


class _Consumer:
    """The progress topic's reader: an empty topic."""

    def __init__(self, conf: dict[str, Any]) -> None: ...

    def get_watermark_offsets(self, partition: Any, timeout: float = -1) -> tuple[int, int]:
        return 0, 0

    def close(self) -> None: ...


@pytest.fixture(autouse=True)
def _fake_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "AdminClient", _Admin)
    monkeypatch.setattr(progress_module, "Consumer", _Consumer)
    _Admin.outcomes, _Admin.asked, _Admin.existing, _Admin.last = [], [], set(), 10


def _progress() -> RelayProgress:
    return RelayProgress(SETTINGS, "billing_outbox")


@pytest.mark.parametrize(("error", "reason"), FOR_GOOD)
def test_a_topic_kafka_refuses_for_good_is_a_configuration_error(
    error: KafkaError, reason: str
) -> None:
    _Admin.outcomes = [KafkaException(error)]
    with pytest.raises(ConfigurationError) as caught:
        _progress().ensure_topic(timeout=10.0)
    message = str(caught.value)
    assert message.startswith(f"Kafka refuses to create the outbox relay's topic {TOPIC!r} (")
    assert reason in message


def test_a_topic_created_beforehand_is_not_created_again() -> None:
    # Kafka checks the Create permission before whether the topic exists: a relay allowed
    # only to write and read its topic was refused for ever.
    _Admin.existing = {TOPIC}
    _Admin.outcomes = [KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))]
    _progress().ensure_topic(timeout=10.0)
    assert _Admin.asked == []


def test_a_collision_says_to_rename() -> None:
    _Admin.outcomes = [KafkaException(COLLISION)]
    with pytest.raises(ConfigurationError, match="use another table name or namespace"):
        _progress().ensure_topic(timeout=10.0)


@pytest.mark.parametrize("error", TRANSIENT)
def test_a_refusal_that_may_change_stays_a_kafka_error_tried_again(error: KafkaError) -> None:
    _Admin.outcomes = [KafkaException(error)]
    with pytest.raises(KafkaException) as caught:
        _progress().ensure_topic(timeout=10.0)
    assert caught.value.args[0].code() == error.code()


def test_a_topic_that_exists_is_fine() -> None:
    _Admin.outcomes = [KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS, "exists"))]
    _progress().ensure_topic(timeout=10.0)
    assert _Admin.asked == [TOPIC]


def test_a_creation_that_did_not_end_in_time_is_a_kafka_timeout() -> None:
    _Admin.outcomes = [TimeoutError()]  # concurrent.futures' (the built-in one)
    with pytest.raises(KafkaException) as caught:
        _progress().ensure_topic(timeout=10.0)
    assert caught.value.args[0].code() == KafkaError._TIMED_OUT
    assert TOPIC in caught.value.args[0].str()


class _Pauses(threading.Event):
    """The relay's stop event: records its pauses; stops the relay at the ``stop_at``-th."""

    def __init__(self, stop_at: int) -> None:
        super().__init__()
        self.waits: list[float | None] = []
        self._stop_at = stop_at

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self._stop_at:
            self.set()
        return self.is_set()


def _recover(database: Path, stop: threading.Event) -> bool:
    relay = OutboxRelay(
        SETTINGS, f"sqlite:///{database}", RelayOptions(table="billing_outbox", retry_s=3.0)
    )
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return relay._recover(connection, SQLITE, _progress(), stop)


def test_a_relay_whose_topic_collides_stops_instead_of_retrying(database: Path) -> None:
    _Admin.outcomes = [KafkaException(COLLISION)] * 5
    stop = _Pauses(stop_at=3)
    with pytest.raises(ConfigurationError, match="collides with existing topic"):
        _recover(database, stop)
    assert stop.waits == []
    assert _Admin.asked == [TOPIC]


@pytest.mark.parametrize(
    "outage", [TimeoutError(), KafkaException(KafkaError(KafkaError._TRANSPORT, "down"))]
)
def test_a_creation_timing_out_is_tried_again_after_a_pause(
    database: Path, outage: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    _Admin.outcomes = [outage, outage]
    stop = _Pauses(stop_at=5)
    assert _recover(database, stop)
    assert stop.waits == [3.0, 3.0]
    assert _Admin.asked == [TOPIC] * 3
    assert caplog.text.count("cannot read the last committed batch of billing_outbox") == 1


class _Producer(FakeProducer):
    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        raise AssertionError("the relay went on past its topic")


def test_the_relay_command_exits_with_code_2_naming_the_topic(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(OutboxRelay, "_producer", lambda relay: _Producer())
    monkeypatch.setattr(outbox_cli, "configure_logging", lambda *args: None)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # pytest's handlers stay
    monkeypatch.setenv("PIPELINE_NAMESPACE", "unit")
    _Admin.outcomes = [KafkaException(COLLISION)] * 5
    _Admin.last = 2  # a relay trying again (2 s between tries) is ended after its second
    with contextlib.closing(sqlite3.connect(database)) as connection:
        create_table(connection, "billing_outbox")
    dsn = f"sqlite:///{database}"
    result = CliRunner().invoke(cli, ["outbox", "relay", "--dsn", dsn, "--table", "billing_outbox"])
    assert not isinstance(result.exception, _Looped), "the relay tried again"
    assert result.exit_code == 2, result.output
    assert f"Kafka refuses to create the outbox relay's topic {TOPIC!r}" in result.output
