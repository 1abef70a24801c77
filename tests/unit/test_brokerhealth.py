"""The broker health tracker: one line per change of reachability, whatever the callbacks say."""

from __future__ import annotations

import json
import logging

import pytest
from confluent_kafka import KafkaError

from pipeline._brokerhealth import GRACE_S, REPEAT_S, SILENT_S, BrokerHealth

REFUSED = "localhost:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def transport(after_ms: int = 0) -> KafkaError:
    return KafkaError(KafkaError._TRANSPORT, f"{REFUSED} (after {after_ms}ms in state CONNECT)")


def all_down() -> KafkaError:
    return KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")


def stats(*states: str) -> str:
    brokers = {f"localhost:{i}/bootstrap": {"state": s, "nodeid": i} for i, s in enumerate(states)}
    return json.dumps({"name": "rdkafka#consumer-1", "ts": 1, "brokers": brokers})


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(clock: Clock, caplog: pytest.LogCaptureFixture) -> BrokerHealth:
    caplog.set_level(logging.DEBUG)
    return BrokerHealth("localhost:1", clock=clock)


def test_an_outage_is_one_line_with_its_cause(
    health: BrokerHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    for attempt in range(500):  # librdkafka retries every 50 ms, each with an error and a line
        health.on_error("consumer", transport(attempt % 3))
        health.callbacks("consumer")["logger"].log(
            logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", f"[thrd:x]: {REFUSED}"
        )
        if attempt == 1:
            health.on_error("consumer", all_down())
        clock.now += 0.05
    [line] = lines(caplog)
    assert line.startswith("Kafka at localhost:1 unreachable since ")
    assert line.endswith(f": {REFUSED}")
    assert health.unreachable_for() == pytest.approx(499 * 0.05)
    assert health.describe() == f"Kafka at localhost:1 unreachable for 25s: {REFUSED}"


def test_back_when_the_client_that_saw_it_reports_a_broker_up(
    health: BrokerHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    health.on_error("consumer", transport())
    health.on_error("consumer", all_down())
    clock.now += 12.0
    health.on_stats("consumer", stats("INIT", "DOWN"))
    assert health.unreachable_for() == 12.0
    health.on_stats("consumer", stats("INIT", "UP"))
    health.on_stats("consumer", stats("UP", "UP"))
    assert health.unreachable_for() is None
    assert not health.down
    assert lines(caplog)[1:] == ["Kafka at localhost:1 reachable again after 12.0s"]


def test_another_clients_word_counts_only_after_the_grace_period(
    health: BrokerHealth, clock: Clock
) -> None:
    health.on_error("consumer", all_down())
    clock.now += GRACE_S / 2
    health.on_stats("leadership", stats("UP"))  # taken before its connection broke, perhaps
    assert health.unreachable_for() is not None
    clock.now += GRACE_S
    health.on_stats("leadership", stats("UP"))
    assert health.unreachable_for() is None


def test_a_delivery_made_during_the_outage_ends_it(health: BrokerHealth, clock: Clock) -> None:
    delivered: list[object] = []
    health.on_error("producer", all_down())
    clock.now += 3.0
    callback = health.watch_delivery("producer", lambda err, msg: delivered.append(err))
    callback(KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"), None)  # type: ignore[arg-type]
    assert health.unreachable_for() == 3.0
    callback(None, None)  # type: ignore[arg-type]
    assert health.unreachable_for() is None
    assert len(delivered) == 2


def test_other_errors_go_to_the_clients_callback(health: BrokerHealth) -> None:
    seen: list[KafkaError] = []
    conf = health.callbacks("consumer", on_error=seen.append)
    conf["error_cb"](transport())
    conf["error_cb"](all_down())
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed")
    conf["error_cb"](denied)
    assert seen == [denied]


SASL_REFUSED = (
    "sasl_ssl://localhost:9/bootstrap: SASL authentication error: Authentication failed "
    "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
    "(after 312ms in state AUTH_REQ)"
)


def test_a_refusal_is_not_an_outage_and_is_told_to_the_client(
    health: BrokerHealth, caplog: pytest.LogCaptureFixture
) -> None:
    refused: list[str] = []
    others: list[KafkaError] = []
    conf = health.callbacks("producer", on_error=others.append, on_refused=refused.append)
    with caplog.at_level(logging.DEBUG, logger="pipeline.kafka"):
        for _ in range(50):  # librdkafka repeats it every few hundred ms
            conf["logger"].log(logging.ERROR, "%s [%s] %s", "FAIL", "p#1", SASL_REFUSED)
            conf["error_cb"](KafkaError(KafkaError._AUTHENTICATION, SASL_REFUSED))
        conf["error_cb"](all_down())
    assert health.refusal == SASL_REFUSED
    assert refused == [SASL_REFUSED] * 100
    assert others == []
    assert health.unreachable_for() is None  # "all brokers down" because they refused
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    health.on_stats("producer", '{"brokers": {"b": {"state": "UP"}}}')
    assert health.refusal is None


def test_repeated_librdkafka_lines_are_logged_once_a_minute(
    health: BrokerHealth, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = health.callbacks("consumer")["logger"]
    for n in range(100):
        log.log(logging.WARNING, "%s [%s] %s", "CONFWARN", "c#1", f"[thrd:app]: bad value {n}")
        log.log(logging.INFO, "%s [%s] %s", "FAIL", "c#1", "Disconnected (after 5ms in state UP)")
    assert lines(caplog) == ["librdkafka CONFWARN: bad value 0"]
    assert len(lines(caplog, logging.DEBUG)) == 101  # the connection lines are kept at DEBUG
    assert REPEAT_S >= 60


def test_stats_that_are_not_json_are_ignored(health: BrokerHealth) -> None:
    health.on_error("consumer", all_down())
    health.on_stats("consumer", "not json")
    health.on_stats("consumer", "[]")
    assert health.unreachable_for() is not None


def test_one_tracker_per_cluster_and_process() -> None:
    assert BrokerHealth.of("a:9092") is BrokerHealth.of("a:9092")
    assert BrokerHealth.of("a:9092") is not BrokerHealth.of("b:9092")


def test_where_a_client_watches_the_cluster_only_its_word_starts_an_outage(
    health: BrokerHealth, clock: Clock
) -> None:
    health.callbacks("consumer", stats=True)
    health.on_stats("consumer", stats("UP"))
    health.on_error("moves producer", all_down())  # served late, by its first poll in a while
    assert health.unreachable_for() is None
    health.on_error("consumer", all_down())
    assert health.unreachable_for() == 0.0


def test_the_delivery_callback_type_is_defined_once() -> None:
    from pipeline import _brokerhealth, _producer

    assert _producer.DeliveryCallback is _brokerhealth.DeliveryCallback


def silent_stats(*idle_s: float) -> str:
    """Statistics of brokers all ``UP``, each last heard from ``idle_s`` ago (``rxidle``)."""
    brokers = {
        f"localhost:{i}/{i}": {"state": "UP", "nodeid": i, "rxidle": int(s * 1_000_000)}
        for i, s in enumerate(idle_s)
    }
    return json.dumps({"name": "rdkafka#consumer-1", "ts": 1, "brokers": brokers})


def test_connected_brokers_that_stay_silent_are_an_outage_until_one_answers(
    health: BrokerHealth, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker frozen (SIGSTOP, a full GC, a network dropping packets) breaks no connection:
    librdkafka reported nothing down, and /healthz answered 200 for as long as it lasted."""
    health.on_stats("consumer", silent_stats(2.0, 300.0))  # one broker idle: it has no work
    assert health.unreachable_for() is None
    health.on_stats("consumer", silent_stats(SILENT_S + 1, 300.0))
    assert health.down
    clock.now += 30.0
    health.on_stats("consumer", silent_stats(SILENT_S + 31, 330.0))
    assert health.describe() == (
        f"Kafka at localhost:1 unreachable for 30s: no broker has answered for "
        f"{SILENT_S + 1:.0f}s (connected)"
    )
    health.on_stats("consumer", silent_stats(0.5, 331.0))
    assert not health.down
    assert lines(caplog, logging.INFO) == [
        lines(caplog, logging.INFO)[0],
        "Kafka at localhost:1 reachable again after 30.0s",
    ]
    assert "unreachable since" in lines(caplog, logging.INFO)[0]
