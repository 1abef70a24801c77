"""One retry relay group per namespace, against real Kafka.

Two groups of workers in one namespace (one per priority, say) each ran a relay over the
namespace's retry tiers in a group of their own (``<workers group>.retry``), and every retried
job came back, and ran, once per group. The relays of every group now share
``<ns>.workers.retry``; a relay whose former group was another takes over from it.
"""

from __future__ import annotations

import json
import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined, unused-ignore]

from pipeline import Job, JobCodec, Priority, Settings
from pipeline._topics import retry_group
from tests.waiting import wait_for

from .fixtures import with_retry_tiers
from .harness import GroupOffsets
from .harness.kafka import describe_group, enqueue, wait_joined

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

RETRY_DELAYS = [0.5, 2.0]
ENV = {"PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS)}


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return with_retry_tiers(bootstrap_servers, namespace, RETRY_DELAYS)


def _drained(kit: WorkerKit, group: str, topics: list[str]) -> None:
    offsets = GroupOffsets(kit.settings, group)
    try:
        offsets.wait_drained(topics, timeout=60, watch=kit.workers.started)
    finally:
        offsets.close()


def test_two_groups_of_workers_run_a_retried_job_once(kit: WorkerKit) -> None:
    ns = kit.settings.namespace
    critical = kit.workers.start("--group", f"{ns}.critical", "--priorities", "critical", env=ENV)
    bulk = kit.workers.start("--group", f"{ns}.bulk", "--priorities", "default,low", env=ENV)
    # Both relays are members of the namespace's one relay group.
    wait_joined(kit.settings, retry_group(kit.settings), [critical, bulk])

    [job] = enqueue(kit.producer, "flaky", 1, fields={"failures": 1}, priority=Priority.DEFAULT)
    assert wait_for(lambda: kit.recording.all_finished([job]), 60), bulk.log_tail()
    # Every relay read the retry past the tiers' ends, and the workers of its priority every
    # copy of it that came back.
    _drained(kit, retry_group(kit.settings), [kit.topics.retry(0), kit.topics.retry(1)])
    _drained(kit, f"{ns}.bulk", [kit.topics.jobs(Priority.DEFAULT)])
    assert kit.recording.run_counts()[job] == 2  # the failed attempt and its retry


def _due(n: int) -> Job:
    payload = json.dumps({"n": n}).encode()
    return Job(id=str(uuid.uuid4()), type="noop", payload=payload, attempt=2)


def _former_member(settings: Settings, group: str, tier: str) -> Consumer:
    """A member of ``group`` on ``tier``, as the relay of a worker of the release before."""
    member = Consumer({**settings.client_config(), "group.id": group, "enable.auto.commit": False})
    member.subscribe([tier])
    assert wait_for(lambda: bool(member.poll(0.1) or member.assignment()), 30)
    return member


@pytest.mark.parametrize("whose", ["its own", "another group's"])
def test_a_relay_waits_for_a_former_group_then_takes_over_its_offsets(
    kit: WorkerKit, whose: str
) -> None:
    """Its own: a worker of group ``fleet`` whose relays were in ``fleet.retry``. Another
    group's: a worker of the default group, while the relays of group ``bulk`` of the release
    before still run (found only by listing the cluster's groups)."""
    ns = kit.settings.namespace
    group = f"{ns}.fleet" if whose == "its own" else f"{ns}.workers"
    former = f"{group}.retry" if whose == "its own" else f"{ns}.bulk.retry"
    tier = kit.topics.retry(0)
    returned, waiting = [_due(n) for n in range(3)], [_due(n) for n in range(3, 6)]
    producer = Producer({"bootstrap.servers": kit.settings.bootstrap_servers})
    codec = JobCodec()
    for job in returned + waiting:
        producer.produce(tier, codec.encode(job), b"key", partition=0)
    assert producer.flush(30) == 0
    # The relays of the release before returned the first three (their group committed that).
    admin = AdminClient(dict(kit.settings.client_config()))
    done = ConsumerGroupTopicPartitions(former, [TopicPartition(tier, 0, len(returned))])
    admin.alter_consumer_group_offsets([done])[former].result(timeout=30)
    member = _former_member(kit.settings, former, tier)
    try:
        worker = kit.workers.start("--group", group, env=ENV)
        waits = f"waits for the 1 members of group {former}"
        assert wait_for(lambda: waits in worker.log(), 60), worker.log_tail()
        assert describe_group(kit.settings, retry_group(kit.settings)).clients == set()
    finally:
        member.close()  # the last worker of the release before stops

    ids = [job.id for job in waiting]
    assert wait_for(lambda: kit.recording.all_finished(ids), 60), worker.log_tail()
    _drained(kit, retry_group(kit.settings), [tier])
    runs = kit.recording.run_counts()
    assert [runs[job.id] for job in waiting] == [1, 1, 1]
    assert [runs[job.id] for job in returned] == [0, 0, 0]
    assert f"took over the offsets of 1 tier partitions from {former}" in worker.log()
