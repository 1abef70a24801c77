"""A ``<ns>.schedules`` topic with several partitions, as a cluster that creates topics on first
write makes it (``num.partitions``): the leader reads them all.

It read only partition 0, and the schedules whose names hash elsewhere never fired.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, TopicPartition

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]

from pipeline._admin import apply_topics
from pipeline._job import now_ms
from pipeline._schedule import make_schedule
from pipeline._scheduletable import publish_schedules
from pipeline._settings import Settings
from pipeline._topics import TopicNames

from .conftest import SchedulerFactory
from .test_invalid_schedules import Jobs

PARTITIONS = 3
NAMES = [f"every-second-{i}" for i in range(8)]


@pytest.fixture
def topics(settings: Settings) -> Settings:
    schedules = TopicNames(settings.namespace).schedules
    admin = AdminClient(dict(settings.client_config()))
    made = NewTopic(schedules, PARTITIONS, 1, config={"cleanup.policy": "compact"})
    admin.create_topics([made])[schedules].result(timeout=30)
    apply_topics(settings)  # leaves the partitions as they are
    return settings


def _partitions_written(settings: Settings) -> set[int]:
    topic = TopicNames(settings.namespace).schedules
    consumer = Consumer({**settings.client_config(), "group.id": f"{settings.namespace}.probe"})
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()
    return {p for p, (low, high) in ends.items() if high > low}


def test_the_leader_fires_the_schedules_of_every_partition(schedulers: SchedulerFactory) -> None:
    settings = schedulers.settings
    publish_schedules(
        settings, [make_schedule(n, cron="* * * * * *", job_type=f"cron.{n}") for n in NAMES]
    )
    assert len(_partitions_written(settings)) > 1  # the names hashed to several partitions
    jobs = Jobs(settings)
    scheduler = schedulers.start()
    schedulers.wait_leading(scheduler)
    started = now_ms()
    try:
        jobs.until(lambda: all(jobs.fires(f"cron.{n}", started) for n in NAMES), 30, "")
    except AssertionError:
        silent = [n for n in NAMES if not jobs.fires(f"cron.{n}", started)]
        pytest.fail(f"never fired: {silent}\n{scheduler.output()[-3000:]}")
    assert f"has {PARTITIONS} partitions" in scheduler.output()
