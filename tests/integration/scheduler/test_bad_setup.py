"""What a takeover finds wrong in Kafka: a bad record on ``<ns>.scheduler-state`` is skipped
(the scheduler leads and releases), and a namespace missing one of the leader's topics stops
the process with exit 1, naming the topic and ``pipeline topics apply`` (as the worker does),
instead of retrying the lead for ever."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from pipeline import Pipeline
from pipeline._admin import apply_topics
from pipeline._cronstate import cron_key
from pipeline._settings import Settings
from pipeline._topics import TopicNames
from pipeline._topicspec import deferred_tier_topic
from tests.waiting import wait_for

from .conftest import SchedulerFactory, collect, job_consumer, scheduler_env


def test_a_bad_state_record_is_skipped_and_the_takeover_goes_on(
    schedulers: SchedulerFactory,
) -> None:
    settings = schedulers.settings
    names = TopicNames(settings.namespace)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    bad = {
        f"offsets:{names.deferred}:0": b'{"v":2,"w":1e400,"p":0,"r":[]}',
        f"offsets:{names.deferred}:1": b'{"v":2,"w":0,"p":9000000000000000000,"r":[0,8e18]}',
        cron_key("nightly").decode(): b'{"v":1,"last":1e400}',
    }
    for key, value in bad.items():
        producer.produce(names.scheduler_state, value, key.encode())
    assert producer.flush(30) == 0

    scheduler = schedulers.start(scheduler_env(horizon_s=2, wait_tiers_s=[1, 4, 15]))
    schedulers.wait_leading(scheduler)
    app = Pipeline(settings)
    job_id = app.enqueue("state.after", {}, delay=1)
    app.flush(30)
    consumer = job_consumer(settings)
    try:
        released = collect(consumer, 1, 30)
    finally:
        consumer.close()
    assert [r.job.id for r in released] == [job_id], scheduler.output()
    assert scheduler.process.poll() is None, scheduler.output()
    output = scheduler.output()
    assert output.count("unreadable scheduler state record skipped") == len(bad), output
    assert "Traceback" not in output


def _delete(settings: Settings, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    admin.delete_topics([topic], operation_timeout=10)[topic].result(30)

    # The controller's deletion reaches the brokers' metadata shortly after.
    assert wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 30), topic


@pytest.mark.parametrize("missing", ["deferred", "tier", "schedules", "state"])
def test_a_missing_topic_of_the_leader_stops_it_naming_the_fix(
    settings: Settings, tmp_path: Path, missing: str
) -> None:
    apply_topics(settings)
    names = TopicNames(settings.namespace)
    env: dict[str, str] = {}
    if missing == "tier":
        # One wait tier more than `pipeline topics apply` created (it ran with fewer).
        tiers = [*settings.scheduler.wait_tiers_s, 86_400]
        env = scheduler_env(wait_tiers_s=tiers)
        topic = deferred_tier_topic(settings.namespace, len(tiers) - 1)
    else:
        topic = {
            "deferred": names.deferred,
            "schedules": names.schedules,
            "state": names.scheduler_state,
        }[missing]
        _delete(settings, topic)
    factory = SchedulerFactory(settings, tmp_path)
    scheduler = factory.start(env)
    try:
        code = scheduler.process.wait(30)
    finally:
        scheduler.kill()
    output = scheduler.output()
    assert code == 1, output
    assert f"topic {topic} does not exist" in output, output
    ns = settings.namespace
    assert f"create the namespace's topics with `pipeline topics apply --namespace {ns}`" in output
    assert "could not take the lead; retrying" not in output, output
    assert "Traceback" not in output, output
