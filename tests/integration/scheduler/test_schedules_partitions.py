"""A ``<ns>.schedules`` topic with several partitions, as a cluster that creates topics on first
write makes it (``num.partitions``): the leader reads them all.

It read only partition 0, and the schedules whose names hash elsewhere never fired. A
schedule's records may be in several partitions (written before partitions were added); a
write goes to partition 0, whose last record wins, and leaves a tombstone of the name in every
other partition, so that no older record wins again once compaction removed the newer one.
"""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]

from pipeline._admin import apply_topics
from pipeline._codec import ScheduleCodec
from pipeline._deadletters import _Reader
from pipeline._job import now_ms
from pipeline._records import Schedule
from pipeline._schedule import make_schedule
from pipeline._scheduletable import delete_schedule, publish_schedules, read_schedules
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


def _write_before(settings: Settings, partition: int, schedules: list[Schedule]) -> None:
    """Write ``schedules`` into ``partition``, an hour old, as a writer did before the topic
    gained partitions (the names hashed elsewhere then)."""
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    topic, codec = TopicNames(settings.namespace).schedules, ScheduleCodec()
    for schedule in schedules:
        producer.produce(
            topic, codec.encode(schedule), schedule.name.encode(), partition=partition,
            timestamp=now_ms() - 3_600_000,
        )  # fmt: skip
    assert producer.flush(30) == 0


def _latest(settings: Settings, name: str) -> dict[int, bytes | None]:
    """Per partition, the value of the last record of ``name`` (absent: none there)."""
    topic = TopicNames(settings.namespace).schedules
    with _Reader(settings, timeout=30) as reader:
        messages = reader.read(topic)[topic]
    return {m.partition() or 0: m.value() for m in messages if m.key() == name.encode()}


def test_the_leader_fires_the_schedules_of_every_partition(schedulers: SchedulerFactory) -> None:
    settings = schedulers.settings
    every_second = [make_schedule(n, cron="* * * * * *", job_type=f"cron.{n}") for n in NAMES]
    # Written before the topic had its partitions: spread over them by name, one removed since.
    for partition in range(PARTITIONS):
        _write_before(settings, partition, every_second[partition::PARTITIONS])
    _write_before(settings, 1, [make_schedule("gone", cron="* * * * * *", job_type="cron.gone")])
    assert len(_partitions_written(settings)) == PARTITIONS
    assert delete_schedule(settings, "gone")
    assert set(read_schedules(settings)) == set(NAMES)
    # The removal is a tombstone in every partition, the newest in the one it was written to.
    assert _latest(settings, "gone") == dict.fromkeys(range(PARTITIONS))
    # A write goes to partition 0, then leaves tombstones in the others.
    changed = make_schedule(
        NAMES[1], cron="* * * * * *", job_type=f"cron.{NAMES[1]}", payload={"v": 2}
    )
    publish_schedules(settings, [changed])
    assert _latest(settings, NAMES[1]) == {
        0: ScheduleCodec().encode(read_schedules(settings)[NAMES[1]]),
        1: None,
        2: None,
    }
    jobs = Jobs(settings)
    scheduler = schedulers.start()
    schedulers.wait_leading(scheduler)
    started = now_ms()
    try:
        jobs.until(lambda: all(jobs.fires(f"cron.{n}", started) for n in NAMES), 30, "")
    except AssertionError:
        silent = [n for n in NAMES if not jobs.fires(f"cron.{n}", started)]
        pytest.fail(f"never fired: {silent}\n{scheduler.output()[-3000:]}")
    assert jobs.fires("cron.gone") == []
    assert f"has {PARTITIONS} partitions" in scheduler.output()
