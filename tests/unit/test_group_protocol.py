"""The workers' group protocol: the consumer options of each protocol, the group configs the
consumer protocol needs, how ``topics apply`` reports them, and eager rebalance callbacks."""

from __future__ import annotations

import pytest

from pipeline import Settings
from pipeline._groupconfig import (
    HEARTBEAT_INTERVAL,
    SESSION_TIMEOUT,
    GroupConfigChange,
    group_configs,
    group_protocol,
    heartbeat_interval_ms,
    plan_group_configs,
)
from pipeline._topicspec import GROUP_ROW, ApplyReport, Change, ChangeAction
from pipeline_worker.intake.config import consumer_config, membership_config
from pipeline_worker.intake.groupproto import incremental

CLASSIC_ONLY = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms")


def test_the_consumer_protocol_is_the_default_and_leaves_out_what_librdkafka_refuses() -> None:
    conf = consumer_config(Settings(namespace="ns"), "g")
    assert conf["group.protocol"] == "consumer"
    assert conf["group.remote.assignor"] == "range"
    for key in CLASSIC_ONLY:
        assert key not in conf, key
    assert incremental(conf)


def test_the_classic_protocol_sets_range_and_the_client_side_timings() -> None:
    settings = Settings(worker={"group_protocol": "classic", "session_timeout_ms": 6000})
    conf = consumer_config(settings, "g")
    assert conf["group.protocol"] == "classic"
    assert conf["partition.assignment.strategy"] == "range"
    assert conf["session.timeout.ms"] == 6000
    assert conf["heartbeat.interval.ms"] == 1000
    assert "group.remote.assignor" not in conf
    assert not incremental(conf)  # range revokes everything at each rebalance


def test_cooperative_sticky_stays_selectable_under_classic() -> None:
    settings = Settings(
        worker={
            "group_protocol": "classic",
            "kafka_consumer": {"partition.assignment.strategy": "cooperative-sticky"},
        }
    )
    conf = consumer_config(settings, "g")
    assert conf["partition.assignment.strategy"] == "cooperative-sticky"
    assert incremental(conf)


def test_a_group_protocol_in_kafka_consumer_decides_the_other_options() -> None:
    settings = Settings(worker={"kafka_consumer": {"group.protocol": "classic"}})
    assert group_protocol(settings.worker) == "classic"
    conf = consumer_config(settings, "g")
    assert conf["partition.assignment.strategy"] == "range"
    assert group_configs(settings) == {}


def test_the_retry_relay_takes_the_brokers_assignor_or_cooperative_sticky() -> None:
    consumer = membership_config(
        Settings().worker, classic_assignor="cooperative-sticky", remote_assignor=None
    )
    assert consumer == {"group.protocol": "consumer"}
    classic = membership_config(
        Settings(worker={"group_protocol": "classic"}).worker,
        classic_assignor="cooperative-sticky",
        remote_assignor=None,
    )
    assert classic["partition.assignment.strategy"] == "cooperative-sticky"


def test_the_protocol_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELINE_WORKER__GROUP_PROTOCOL", "classic")
    assert Settings().worker.group_protocol == "classic"
    monkeypatch.setenv("PIPELINE_WORKER__GROUP_PROTOCOL", "eager")
    with pytest.raises(ValueError, match="group_protocol"):
        Settings()


@pytest.mark.parametrize(
    ("session", "heartbeat"), [(45_000, 1000), (6000, 1000), (3000, 1000), (1500, 500), (90, 100)]
)
def test_the_heartbeat_is_a_third_of_the_session_at_most_a_second(
    session: int, heartbeat: int
) -> None:
    assert heartbeat_interval_ms(session) == heartbeat


def test_group_configs_of_both_worker_groups_under_the_consumer_protocol() -> None:
    settings = Settings(namespace="acme", worker={"session_timeout_ms": 6000})
    wanted = {SESSION_TIMEOUT: "6000", HEARTBEAT_INTERVAL: "1000"}
    assert group_configs(settings) == {"acme.workers": wanted, "acme.workers.retry": wanted}
    named = Settings(namespace="acme", worker={"group_id": "mine"})
    assert set(group_configs(named)) == {"mine", "acme.workers.retry"}  # one per namespace
    assert group_configs(Settings(worker={"group_protocol": "classic"})) == {}


def test_plan_sets_what_differs_and_what_the_broker_defaults() -> None:
    wanted = {"g": {SESSION_TIMEOUT: "6000", HEARTBEAT_INTERVAL: "1000"}}
    # A default that happens to equal the wanted value is set all the same.
    fresh = plan_group_configs(wanted, {"g": {SESSION_TIMEOUT: None, HEARTBEAT_INTERVAL: None}})
    assert fresh == [
        GroupConfigChange("g", SESSION_TIMEOUT, None, "6000"),
        GroupConfigChange("g", HEARTBEAT_INTERVAL, None, "1000"),
    ]
    assert fresh[0].describe() == f"{SESSION_TIMEOUT} the broker default -> 6000"
    partly = plan_group_configs(
        wanted, {"g": {SESSION_TIMEOUT: "45000", HEARTBEAT_INTERVAL: "1000"}}
    )
    assert partly == [GroupConfigChange("g", SESSION_TIMEOUT, "45000", "6000")]
    assert plan_group_configs(wanted, {"g": dict(wanted["g"])}) == []
    assert len(plan_group_configs(wanted, {})) == 2  # a group Kafka said nothing about


def test_the_apply_summary_counts_groups_apart_from_topics() -> None:
    changes = (
        Change("t", ChangeAction.CONFIG, "retention.ms 1 -> 2"),
        Change(f"{GROUP_ROW}g", ChangeAction.CONFIG, f"{SESSION_TIMEOUT} 45000 -> 6000"),
        Change(f"{GROUP_ROW}g", ChangeAction.CONFIG, f"{HEARTBEAT_INTERVAL} 5000 -> 1000"),
    )
    assert ApplyReport(changes).summary() == "changed 3 settings on 1 topic and 1 group"
    assert ApplyReport(changes[1:]).summary() == "changed 2 settings on 1 group"
