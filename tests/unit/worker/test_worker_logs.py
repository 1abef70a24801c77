"""What the worker's log lines say about partitions and throughput."""

from __future__ import annotations

from confluent_kafka import OFFSET_INVALID, TopicPartition

from pipeline_worker._metrics import per_second
from pipeline_worker.commit.committer import describe


def test_an_assignment_lists_partitions_without_invalid_offsets() -> None:
    assigned = [
        TopicPartition("ns.jobs.high", 0, OFFSET_INVALID),
        TopicPartition("ns.jobs.high", 1, OFFSET_INVALID),
        TopicPartition("ns.jobs.low", 0, OFFSET_INVALID),
    ]
    assert describe(assigned) == "ns.jobs.high[0,1],ns.jobs.low[0]"


def test_known_offsets_are_shown() -> None:
    offsets = [TopicPartition("ns.jobs.high", 0, 42), TopicPartition("ns.jobs.high", 2, 0)]
    assert describe(offsets) == "ns.jobs.high[0@42,2@0]"


def test_a_slow_rate_is_not_rounded_to_zero() -> None:
    assert per_second(3, 10.0) == 0.3
    assert per_second(1, 3.0) == 0.333
    assert per_second(5, 2.0) == 2.5


def test_a_fast_rate_keeps_its_integer_part() -> None:
    assert per_second(53_412, 1.0) == 53_412
    assert per_second(100_000, 3.0) == 33_333


def test_no_rate_without_time() -> None:
    assert per_second(0, 5.0) == 0.0
    assert per_second(10, 0.0) is None
