"""The scheduler's committed offsets follow what it has read, even when nothing is due."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from pipeline import Pipeline, Settings
from pipeline._topics import TopicNames, deferred_group
from tests.waiting import wait_for

from .conftest import SchedulerFactory, scheduler_env


def behind(settings: Settings) -> int:
    """Messages of ``<ns>.deferred`` past the scheduler group's committed offsets."""
    topic = TopicNames(settings.namespace).deferred
    consumer = Consumer(
        {"bootstrap.servers": settings.bootstrap_servers, "group.id": deferred_group(settings)}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        lag = 0
        for tp in consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=10):
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            committed = tp.offset if tp.offset >= 0 else low
            lag += max(0, high - 1 - committed)  # the last offset may be a transaction marker
        return lag
    finally:
        consumer.close()


def test_offsets_of_far_jobs_are_committed_before_anything_is_due(
    schedulers: SchedulerFactory,
) -> None:
    """5,000 jobs due in an hour go on to the wait tiers at once, in transactions of 100 (many
    a second, which send their offsets about once a second), and then nothing is due for a
    minute (the smallest tier): the offsets left unsent must not wait for that minute, or the
    deferred group's lag shows jobs the scheduler has long taken care of."""
    settings = schedulers.settings
    app = Pipeline(settings)
    for i in range(5_000):
        app.enqueue("far.job", {"i": i}, delay=3600)
    app.flush()
    scheduler = schedulers.start(scheduler_env(batch_max=100))
    schedulers.wait_leading(scheduler)
    # Within 30 s: the smallest wait tier (60 s) brings the next move, which sent them before.
    caught_up = wait_for(lambda: behind(settings) == 0, 30, interval=0.5)
    assert caught_up, f"{behind(settings)} behind\n{scheduler.output()[-3000:]}"
