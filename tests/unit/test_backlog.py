"""The backlog arithmetic of pipeline._backlog: what a group has not committed, and ages."""

from __future__ import annotations

from pipeline._backlog import _numbered
from pipeline._backlogmodel import Backlog, PartitionBacklog, TopicBacklog
from pipeline._deadletters import DlqStats
from pipeline._settings import Settings
from pipeline._topics import worker_group
from pipeline._workersettings import WorkerSettings

NO_LETTERS = DlqStats({"pending": 0, "replayed": 0, "discarded": 0}, {}, {}, 0)


def test_waiting_is_end_minus_the_commit() -> None:
    assert PartitionBacklog(0, start=0, end=10, committed=4, oldest_ms=None).waiting == 6
    assert PartitionBacklog(0, start=0, end=10, committed=10, oldest_ms=None).waiting == 0


def test_nothing_committed_counts_from_the_start() -> None:
    assert PartitionBacklog(0, start=3, end=10, committed=None, oldest_ms=None).waiting == 7


def test_a_commit_below_the_retained_start_counts_from_the_start() -> None:
    # retention deleted messages the group never committed past: they are gone, not waiting
    assert PartitionBacklog(0, start=8, end=10, committed=2, oldest_ms=None).waiting == 2


def test_topic_sums_partitions_and_takes_the_oldest() -> None:
    topic = TopicBacklog(
        "ns.jobs.high",
        "ns.workers",
        (
            PartitionBacklog(0, 0, 5, 5, None),
            PartitionBacklog(1, 0, 5, 1, 2_000),
            PartitionBacklog(2, 0, 5, 2, 1_000),
        ),
    )
    assert topic.waiting == 7
    assert topic.oldest_ms == 1_000
    backlog = Backlog(10.0, {"high": topic}, (), (), NO_LETTERS, {})
    assert backlog.oldest_age_s("high") == 9.0


def test_empty_priority_has_age_zero() -> None:
    topic = TopicBacklog("ns.jobs.low", "ns.workers", (PartitionBacklog(0, 4, 4, None, None),))
    assert topic.waiting == 0
    assert Backlog(10.0, {"low": topic}, (), (), NO_LETTERS, {}).oldest_age_s("low") == 0.0


def test_worker_group_follows_the_setting() -> None:
    assert worker_group(Settings(namespace="orders")) == "orders.workers"
    custom = Settings(namespace="orders", worker=WorkerSettings(group_id="blue"))
    assert worker_group(custom) == "blue"


def test_tiers_are_the_numbered_topics_found_in_number_order() -> None:
    topics = ["a.b.retry.10", "a.b.retry.2", "a.b.retry.x", "a.bretry.1", "c.retry.1", "a.b.dlq"]
    assert _numbered(topics, r"a\.b\.retry\.(\d+)") == ["a.b.retry.2", "a.b.retry.10"]


def test_labels_are_the_priority_the_tier_number_deferred_or_the_wait_tier() -> None:
    def label(topic: str) -> str:
        return TopicBacklog(topic, "g", ()).label

    assert label("a.b.jobs.high") == "high"
    assert label("a.b.retry.3") == "3"
    assert label("a.b.deferred") == "deferred"
    assert label("a.b.deferred.0") == "wait 0"


def test_position_end_and_age_for_rates_and_status() -> None:
    topic = TopicBacklog(
        "ns.jobs.high",
        "ns.workers",
        (PartitionBacklog(0, 3, 10, None, 4_000), PartitionBacklog(1, 0, 5, 5, 1_000)),
    )
    assert (topic.position, topic.end) == (8, 15)
    # partition 1 has nothing waiting: its stamp is not the oldest waiting job
    assert topic.oldest_ms == 4_000
    assert topic.oldest_age_s(10_000) == 6.0
    assert TopicBacklog("ns.jobs.low", "ns.workers", ()).oldest_age_s(10_000) is None


def test_a_commit_past_the_end_counts_from_the_start() -> None:
    # a log truncated under the commit (unclean leader election, a manual offset reset): the
    # commit is out of range, so a worker restarts at the earliest offset and every job waits
    partition = PartitionBacklog(0, start=0, end=10, committed=50, oldest_ms=None)
    assert (partition.position, partition.waiting) == (0, 10)
