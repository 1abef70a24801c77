"""One key across priorities: the assignor must co-partition, and a slot runs only when whole."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pipeline import Priority
from pipeline_worker._work import PartitionState
from pipeline_worker.intake import assignment
from pipeline_worker.intake.assignment import Slots
from pipeline_worker.intake.groupproto import copartitioning_problem, incremental

HIGH, LOW = "ns.jobs.high", "ns.jobs.low"


@pytest.mark.parametrize(
    ("conf", "problem"),
    [
        ({"partition.assignment.strategy": "range"}, None),
        ({}, None),  # librdkafka's default list starts with range
        ({"partition.assignment.strategy": "cooperative-sticky"}, "cooperative-sticky"),
        ({"partition.assignment.strategy": "roundrobin,range"}, "roundrobin"),
        ({"group.protocol": "consumer", "group.remote.assignor": "range"}, None),
        ({"group.protocol": "consumer", "group.remote.assignor": "uniform"}, "uniform"),
        ({"group.protocol": "consumer"}, "uniform (the broker's default)"),
    ],
)
def test_only_a_range_assignor_co_partitions(conf: dict[str, Any], problem: str | None) -> None:
    found = copartitioning_problem(conf)
    if problem is None:
        assert found is None
    else:
        assert found is not None
        assert f"assignor is {problem}," in found
        assert 'worker.dedup_scope = "priority"' in found


def test_rebalances_are_incremental_under_the_consumer_protocol_and_cooperative_sticky() -> None:
    assert incremental({"group.protocol": "consumer"})
    assert incremental({"partition.assignment.strategy": "cooperative-sticky"})
    assert not incremental({"partition.assignment.strategy": "range"})
    assert not incremental({"group.protocol": "classic"})


def state(topic: str, partition: int) -> PartitionState:
    return PartitionState(topic, partition, Priority.HIGH, 0)


def test_a_partition_waits_until_its_slot_is_assigned_whole() -> None:
    states: dict[tuple[str, int], PartitionState] = {}
    slots = Slots([HIGH, LOW], states, {HIGH: 4, LOW: 2})
    high_1, high_3 = state(HIGH, 1), state(HIGH, 3)
    for s in (high_1, high_3):
        states[(s.topic, s.partition)] = s
    whole, waiting = slots.split([high_1, high_3])
    assert whole == [high_3], "low has no partition 3: high's partition 3 is a slot alone"
    assert waiting == [high_1]
    assert slots.missing(1) == [LOW]
    low_1 = state(LOW, 1)
    states[(LOW, 1)] = low_1
    assert slots.split([high_1, low_1]) == ([high_1, low_1], [])


def test_a_slot_that_stays_split_is_reported(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr("pipeline_worker.intake.assignment.time.monotonic", lambda: clock[0])
    high_0 = state(HIGH, 0)
    slots = Slots([HIGH, LOW], {(HIGH, 0): high_0}, {})
    with caplog.at_level(logging.WARNING, logger="pipeline.worker.consumer"):
        slots.split([high_0])
        assert caplog.records == []
        clock[0] += assignment.SLOT_WAIT_WARN_S
        assert slots.split([high_0]) == ([], [high_0])
    [record] = caplog.records
    assert "partition 0 of ns.jobs.high waits for partition 0 of ns.jobs.low" in record.getMessage()


def test_a_worker_refuses_an_assignor_that_would_run_one_key_twice() -> None:
    from pipeline import Settings
    from pipeline._errors import ConfigurationError
    from pipeline_worker._metrics import WorkerMetrics
    from pipeline_worker.intake.consumer import ConsumerThread

    def thread(**worker: Any) -> ConsumerThread:
        return ConsumerThread(
            settings=Settings(namespace="ns", worker=worker),
            group_id="ns.workers",
            topics={HIGH: (Priority.HIGH, 0), LOW: (Priority.LOW, 1)},
            side=None,  # type: ignore[arg-type]
            metrics=WorkerMetrics(),
            consumer_factory=lambda conf: pytest.fail("refused before a consumer is made"),
        )

    sticky = {"partition.assignment.strategy": "cooperative-sticky"}
    with pytest.raises(ConfigurationError, match="assignor is cooperative-sticky"):
        thread(group_protocol="classic", kafka_consumer=sticky)
    with pytest.raises(ConfigurationError, match="assignor is uniform"):
        thread(kafka_consumer={"group.remote.assignor": "uniform"})
    with pytest.raises(pytest.fail.Exception, match="refused before"):
        thread(group_protocol="classic", kafka_consumer=sticky, dedup_scope="priority")
    with pytest.raises(pytest.fail.Exception, match="refused before"):
        thread()  # the default: the consumer protocol with the broker's range assignor
