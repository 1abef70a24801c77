"""``--burst`` with more group members than partitions, under each consumer group protocol: a
member the group gives no partition exits once the backlog is done, like the others.

Under the consumer protocol (KIP-848) librdkafka calls no assignment callback for a member whose
assignment is empty from the start: the worker learns from the group's description that it has
joined with nothing to own."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings

from .harness import check_ran, enqueue, wait_joined, wait_until

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

PROTOCOLS = ["consumer", "classic"]
ARGS = ("--priorities", "default", "--concurrency", "4")


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    """Topics of two partitions: three members are one too many."""
    return Settings(
        bootstrap_servers=bootstrap_servers, namespace=namespace, topics={"partitions": 2}
    )


@pytest.mark.slow  # a guard: the member left out gets a partition when the owners leave
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_three_burst_workers_on_two_partitions_all_exit_once_the_jobs_ran(
    kit: WorkerKit, protocol: str
) -> None:
    # A member left without a partition here gets one when the owners, drained, leave.
    ids = enqueue(kit.producer, "noop", 20, priority="default")
    env = {"PIPELINE_WORKER__GROUP_PROTOCOL": protocol}
    workers = [kit.workers.start(*ARGS, "--burst", env=env) for _ in range(3)]
    for worker in workers:
        assert worker.wait(timeout=60) == 0, worker.log_tail()
    assert check_ran(kit.recording, ids, exactly_once=True) == []
    assert kit.offsets.lag([kit.topics.jobs("default")]) == {}


STICKY = {
    "consumer": {"group.remote.assignor": "uniform"},
    "classic": {"partition.assignment.strategy": "cooperative-sticky"},
}
"""Assignors that leave a partition with its owner while the owners are as many as the
partitions, so that the members joining later get nothing (the range assignors may hand them a
partition or not)."""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_burst_workers_the_group_gives_no_partition_exit_once_the_group_drained(
    kit: WorkerKit, protocol: str
) -> None:
    # Two long-running workers own the two partitions; the burst workers that join get nothing.
    env = {
        "PIPELINE_WORKER__GROUP_PROTOCOL": protocol,
        "PIPELINE_WORKER__KAFKA_CONSUMER": json.dumps(STICKY[protocol]),
    }
    owners = [kit.workers.start(*ARGS, env=env) for _ in range(2)]
    wait_joined(kit.settings, kit.offsets.group, owners)
    ids = enqueue(kit.producer, "noop", 20, priority="default")
    wait_until(
        lambda: kit.recording.all_finished(ids), timeout=60, what="the jobs to run", watch=owners
    )

    bursts = [kit.workers.start(*ARGS, "--burst", env=env) for _ in range(2)]
    for worker in bursts:
        assert worker.wait(timeout=30) == 0, worker.log_tail()
        assert not _owned_some(worker.log()), worker.log_tail()
    assert all(w.alive() for w in owners), "the owners kept their partitions all along"
    assert check_ran(kit.recording, ids, exactly_once=True) == []


def _owned_some(log: str) -> bool:
    """Whether the group assigned the worker a partition of the jobs' topics."""
    return any(
        "pipeline.worker.consumer" in line and "partitions assigned" in line
        for line in log.splitlines()
    )
