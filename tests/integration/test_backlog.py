"""The one backlog read (``pipeline status`` and ``pipeline exporter``) against a real Kafka: the
oldest waiting message of every tier, and the members of a group with their host."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined, unused-ignore]

from pipeline._admin import apply_topics
from pipeline._backlog import BacklogReader, read_backlog
from pipeline._job import now_ms
from pipeline._settings import Settings
from pipeline._topics import TopicNames, worker_group
from pipeline._topicspec import deferred_tier_topic

from ..waiting import wait_for


def test_every_tier_has_its_oldest_and_members_have_a_plain_host(settings: Settings) -> None:
    apply_topics(settings)
    written_at = now_ms() - 60_000  # recent: retention would delete an older one
    names = TopicNames(settings.namespace)
    wait_tier = deferred_tier_topic(settings.namespace, 0)
    producer = Producer(settings.client_config())
    producer.produce(names.retry(1), b"waiting", partition=0, timestamp=written_at)
    producer.produce(wait_tier, b"waiting", partition=0, timestamp=written_at + 1)
    producer.produce(names.jobs("low"), b"waiting", partition=0, timestamp=written_at + 2)
    assert producer.flush(30) == 0

    with BacklogReader(settings, timeout=20) as reader:
        backlog = reader.read()
        retries = {tier.label: tier for tier in backlog.retries}
        assert list(retries) == ["0", "1", "2", "3"]
        assert retries["1"].waiting == 1
        assert retries["1"].oldest_ms == written_at
        assert retries["1"].oldest_age_s(written_at + 5_000) == 5.0
        assert retries["0"].oldest_ms is None
        deferred = {topic.label: topic for topic in backlog.deferred}
        assert list(deferred)[:2] == ["deferred", "wait 0"]
        assert deferred["wait 0"].oldest_ms == written_at + 1
        low = backlog.jobs["low"]
        assert (low.label, low.waiting, low.oldest_ms) == ("low", 1, written_at + 2)
        assert backlog.groups["worker"].members == ()

        member = Consumer(
            {
                **settings.client_config(),
                "group.id": worker_group(settings),
                "client.id": "reader-test",
                "enable.auto.commit": False,
            }
        )
        try:
            member.subscribe([names.jobs("low")])

            def joined() -> bool:
                member.poll(0.1)
                return bool(member.assignment())

            assert wait_for(joined, 30)
            workers = reader.read().groups["worker"]
        finally:
            member.close()
    assert [m.client_id for m in workers.members] == ["reader-test"]
    assert workers.members[0].member_id
    assert workers.members[0].host
    assert not workers.members[0].host.startswith("/")
    assert (names.jobs("low"), 0) in workers.members[0].partitions


def test_aborted_messages_and_markers_ahead_of_the_first_job_are_not_backlog(
    settings: Settings,
) -> None:
    apply_topics(settings)
    topic = TopicNames(settings.namespace).jobs("default")
    written_at = now_ms() - 60_000
    producer = Producer(
        {**settings.client_config(), "transactional.id": f"{settings.namespace}.test-aborts"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(50):
        producer.produce(topic, b"aborted", partition=0)
    producer.produce(topic, b"aborted", partition=1)
    assert producer.flush(30) == 0  # written, then aborted (an abort drops what is unsent)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"job", partition=1, timestamp=written_at)
    producer.commit_transaction(30)

    with BacklogReader(settings, timeout=20) as reader:
        default = reader.read().jobs["default"]
    by_partition = {p.partition: p for p in default.partitions}
    # 50 aborted messages and the abort marker: no job a worker would run
    assert (by_partition[0].end, by_partition[0].waiting) == (51, 0)
    # an aborted message, its marker, then the job and its commit marker (which counts)
    assert (by_partition[1].end, by_partition[1].waiting) == (4, 2)
    assert default.waiting == 2
    assert default.oldest_ms == written_at


def test_a_job_without_a_timestamp_has_no_age(settings: Settings) -> None:
    # a client on the v0 message format writes no timestamp: Kafka keeps -1
    apply_topics(settings)
    producer = Producer(settings.client_config())
    producer.produce(TopicNames(settings.namespace).jobs("low"), b"old client", timestamp=-1)
    assert producer.flush(30) == 0

    backlog = read_backlog(settings, timeout=20)
    assert (backlog.jobs["low"].waiting, backlog.jobs["low"].oldest_ms) == (1, None)
    assert backlog.oldest_age_s("low") == 0.0  # unknown, not 56 years


def test_jobs_deleted_under_the_read_leave_the_rest_waiting(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no worker committed: the read starts at the earliest offset, which delete-records (or
    # retention) moves on between the offsets listed and the fetch
    apply_topics(settings)
    topic = TopicNames(settings.namespace).jobs("low")
    written_at = now_ms() - 60_000
    producer = Producer(settings.client_config())
    for n in range(10):
        producer.produce(topic, b"job", partition=0, timestamp=written_at + n)
    assert producer.flush(30) == 0
    admin = AdminClient({**settings.client_config()})

    with BacklogReader(settings, timeout=20) as reader:
        heads = reader._heads

        def deleting_first(starts: list[TopicPartition]) -> Any:
            done = admin.delete_records([TopicPartition(topic, 0, 4)], request_timeout=20)
            for future in done.values():
                future.result()
            return heads(starts)

        monkeypatch.setattr(reader, "_heads", deleting_first)
        low = reader.read().jobs["low"]
    assert (low.waiting, low.oldest_ms) == (6, written_at + 4)
