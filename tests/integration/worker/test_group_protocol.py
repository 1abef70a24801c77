"""Workers under each consumer group protocol: they co-partition the priority topics and drain
them, and under the consumer protocol (KIP-848) the group config the worker sets is the session
timeout that hands a dead worker's partitions over."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import ConsumerGroupType

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    ConfigResource,
    ResourceType,
)

from pipeline import Priority
from pipeline._groupconfig import HEARTBEAT_INTERVAL, SESSION_TIMEOUT
from pipeline._topics import retry_group

from .harness import check_ran, enqueue, wait_joined, wait_until
from .scenarios import FAST_FAILOVER

if TYPE_CHECKING:
    from confluent_kafka.admin import ConsumerGroupDescription

    from pipeline import Settings

    from .fixtures import WorkerKit
    from .harness import WorkerProcess

pytestmark = pytest.mark.kafka

DEFAULT_SESSION_S = 45.0
"""The broker's default consumer.session.timeout.ms, which the group config replaces."""
RECOVERY_BOUND_S = 15.0
"""With the default settings a SIGKILLed worker's partitions run again within this."""


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(dict(settings.client_config()))


def _describe(settings: Settings, group: str) -> ConsumerGroupDescription:
    admin = _admin(settings)  # kept until the answer: a collected client never answers
    futures = admin.describe_consumer_groups([group], request_timeout=10)
    description: ConsumerGroupDescription = futures[group].result(timeout=15)
    return description


def _partitions_by_member(description: ConsumerGroupDescription) -> dict[str, dict[str, set[int]]]:
    """client id -> topic -> the partitions the member is assigned."""
    found: dict[str, dict[str, set[int]]] = {}
    for member in description.members:
        topics: dict[str, set[int]] = defaultdict(set)
        for tp in member.assignment.topic_partitions:
            topics[tp.topic].add(tp.partition)
        found[member.client_id] = dict(topics)
    return found


def _group_configs(settings: Settings, group: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.GROUP, group)
    admin = _admin(settings)
    entries = admin.describe_configs([resource])[resource].result(timeout=15)
    return {key: entries[key].value for key in (SESSION_TIMEOUT, HEARTBEAT_INTERVAL)}


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_two_workers_co_partition_every_priority_and_drain_it(
    kit: WorkerKit, protocol: str
) -> None:
    env = {"PIPELINE_WORKER__GROUP_PROTOCOL": protocol}
    workers = [kit.workers.start("--concurrency", "20", env=env) for _ in range(2)]
    wait_joined(kit.settings, kit.offsets.group, workers)
    description = _describe(kit.settings, kit.offsets.group)
    expected = ConsumerGroupType.CONSUMER if protocol == "consumer" else ConsumerGroupType.CLASSIC
    assert description.type == expected
    assigned = _partitions_by_member(description)
    assert set(assigned) == {w.client_id for w in workers}
    topics = kit.topics.all_jobs()
    partitions = kit.settings.topics.partitions
    owners: dict[int, set[str]] = defaultdict(set)
    for client, by_topic in assigned.items():
        # Partition p of every priority topic goes to one member: co-partitioned.
        assert len({frozenset(by_topic.get(t, set())) for t in topics}) == 1, (client, by_topic)
        for partition in by_topic.get(topics[0], set()):
            owners[partition].add(client)
    assert {p: len(o) for p, o in owners.items()} == dict.fromkeys(range(partitions), 1)

    ids = [
        job_id
        for priority in Priority
        for job_id in enqueue(kit.producer, "noop", 60, priority=priority.value)
    ]
    wait_until(
        lambda: kit.recording.all_finished(ids),
        timeout=120,
        what=lambda: f"{len(ids)} jobs to finish ({kit.recording.count('E')} did)",
        watch=workers,
    )
    assert check_ran(kit.recording, ids, exactly_once=True) == []


def test_a_sigkilled_worker_hands_over_within_the_session_timeout_the_worker_set(
    kit: WorkerKit,
) -> None:
    settings = kit.settings
    first, second = (kit.workers.start("--concurrency", "20", env=FAST_FAILOVER) for _ in (1, 2))
    wait_joined(settings, kit.offsets.group, [first, second])
    session = FAST_FAILOVER["PIPELINE_WORKER__SESSION_TIMEOUT_MS"]
    wanted = {SESSION_TIMEOUT: session, HEARTBEAT_INTERVAL: "1000"}
    # Both groups of the workers carry the session timeout as a group config now.
    assert _group_configs(settings, kit.offsets.group) == wanted
    assert _group_configs(settings, retry_group(settings)) == wanted

    first.kill()

    def second_owns_everything() -> bool:
        description = _describe(settings, kit.offsets.group)
        owned = _partitions_by_member(description)
        everything = {t: set(range(settings.topics.partitions)) for t in kit.topics.all_jobs()}
        return set(owned) == {second.client_id} and owned[second.client_id] == everything

    # Below the broker's default session timeout: only the group config makes this possible.
    wait_until(
        second_owns_everything,
        timeout=DEFAULT_SESSION_S - 5,
        what=lambda: (
            f"the survivor to own every partition: {_describe(settings, kit.offsets.group)}"
        ),
        watch=[second],
    )
    ids = enqueue(kit.producer, "noop", 100, priority="default")
    wait_until(
        lambda: kit.recording.all_finished(ids),
        timeout=60,
        what="the survivor to run the jobs",
        watch=[second],
    )
    assert {e.pid for e in kit.recording.starts() if e.job_id in set(ids)} == {second.pid}


def test_a_session_timeout_the_broker_refuses_is_a_warning_and_the_worker_runs(
    kit: WorkerKit,
) -> None:
    # The dev broker's smallest session timeout is 6 s (as the classic protocol's default).
    worker = kit.workers.start(
        "--concurrency", "4", env={"PIPELINE_WORKER__SESSION_TIMEOUT_MS": "3000"}
    )
    ids = enqueue(kit.producer, "noop", 20, priority="default")
    wait_until(
        lambda: kit.recording.all_finished(ids),
        timeout=90,
        what="the jobs to run",
        watch=[worker],
    )
    log = worker.log()
    assert "could not set the consumer group configs for worker.session_timeout_ms=3000" in log
    assert "group.consumer.min.session.timeout.ms" in log  # what to change, named


# The default run has a SIGKILLed worker handing over with the worker set's session timeout
# (above); these wait out the brokers' default timeouts.
@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_a_sigkilled_workers_partitions_run_again_within_15_s_with_the_default_settings(
    kit: WorkerKit, protocol: str
) -> None:
    settings = kit.settings
    env = {"PIPELINE_WORKER__GROUP_PROTOCOL": protocol}  # nothing about timeouts
    first, second = (kit.workers.start("--concurrency", "20", env=env) for _ in (1, 2))
    wait_joined(settings, kit.offsets.group, [first, second])
    topic = kit.topics.jobs(Priority.DEFAULT)

    def owned(worker: WorkerProcess) -> set[tuple[str, int]]:
        members = _partitions_by_member(_describe(settings, kit.offsets.group))
        return {(topic, p) for p in members.get(worker.client_id, {}).get(topic, set())}

    wait_until(
        lambda: bool(owned(first)) and bool(owned(second)),
        timeout=60,
        what=lambda: f"both workers to own partitions: {_describe(settings, kit.offsets.group)}",
        watch=[first, second],
    )
    dead = owned(first)

    killed_ns = time.time_ns()
    first.kill()
    # Keyed, so every partition gets its share (jobs sit in the dead worker's partitions).
    for n in range(200):
        kit.producer.enqueue("noop", {"n": n}, priority="default", key=str(n))
    kit.producer.flush(30)

    def back() -> dict[tuple[str, int], int]:
        """The survivor's first start on each of the dead worker's partitions since the kill."""
        found: dict[tuple[str, int], int] = {}
        for event in kit.recording.starts():
            if event.pid == second.pid and event.tp in dead and event.time_ns > killed_ns:
                found[event.tp] = min(event.time_ns, found.get(event.tp, event.time_ns))
        return found

    wait_until(
        lambda: set(back()) == dead,
        timeout=2 * RECOVERY_BOUND_S,
        what=lambda: f"the survivor to run {sorted(dead)}: it ran {sorted(back())}",
        watch=[second],
    )
    took_s = (max(back().values()) - killed_ns) / 1e9
    assert took_s < RECOVERY_BOUND_S, f"{took_s:.1f}s from the SIGKILL to the last partition back"
