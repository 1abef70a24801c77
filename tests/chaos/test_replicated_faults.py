"""Faults on a replicated cluster, counted: 3 nodes, replication 3, ``min.insync.replicas=2``,
a producer that never stops (acks=all) and two workers, each on a host of its own (network
namespaces), sharing every priority's partitions. Each scenario counts acknowledged, processed
once, processed twice or more and lost (acknowledged - processed), and passes with lost = 0.

The counts of a run are in ``docs/reliability.md``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.faults.cluster import active_controller, coordinator, out_of_sync, wait_in_sync
from tests.faults.fixtures import fault_run, host_network, hosted_cluster
from tests.faults.run import WORKER_HOSTS
from tests.integration.worker.harness import wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pipeline_cli.devbroker import DevCluster
    from tests.faults.netns import HostNetwork
    from tests.faults.run import Counts, FaultRun

__all__ = ["host_network", "hosted_cluster"]

CUT_OFF_S = 30.0


@pytest.fixture
def run(
    hosted_cluster: DevCluster, host_network: HostNetwork, namespace: str, tmp_path: Path
) -> Iterator[FaultRun]:
    yield from fault_run(hosted_cluster, namespace, tmp_path, host_network)


def check(run: FaultRun, counts: Counts) -> None:
    """Nothing acknowledged was lost, and both workers ran jobs of every priority."""
    assert counts.acknowledged > 0, run.producer_output()
    assert counts.lost == 0, counts
    workers = {worker.pid for worker in run.workers}
    shared = run.hosts_of_priorities()
    assert all(pids == workers for pids in shared.values()), (shared, workers)


def test_a_broker_sigkilled_twice_coordinator_then_controller(
    run: FaultRun, hosted_cluster: DevCluster
) -> None:
    run.start()
    killed = []
    for role in ("group coordinator", "active controller"):
        roles = {
            "group coordinator": coordinator(run.settings, run.group),
            "active controller": active_controller(hosted_cluster),
        }
        node_id = roles[role]
        killed.append(
            f"node {node_id} ({' and '.join(r for r, n in roles.items() if n == node_id)})"
        )
        hosted_cluster.stop_node(node_id - 1, hard=True)
        run.wait_running()  # two of three replicas keep taking and serving jobs
        hosted_cluster.start_node(node_id - 1)
        wait_in_sync(run.settings)
        run.wait_running()
    counts = run.finish("SIGKILL + restart of " + ", then ".join(killed))
    check(run, counts)


def test_a_rolling_restart_of_all_three_brokers(run: FaultRun, hosted_cluster: DevCluster) -> None:
    run.start()
    for index in range(len(hosted_cluster.nodes)):
        hosted_cluster.stop_node(index)  # SIGTERM: a clean shutdown, as for an upgrade
        run.wait_running()
        hosted_cluster.start_node(index)
        wait_in_sync(run.settings)
    run.wait_running()
    check(run, run.finish("rolling restart (SIGTERM, start, wait in sync) of nodes 1, 2, 3"))


def test_all_three_brokers_sigkilled_and_restarted(
    run: FaultRun, hosted_cluster: DevCluster
) -> None:
    run.start()
    everyone = range(len(hosted_cluster.nodes))
    for index in everyone:
        hosted_cluster.stop_node(index, hard=True)
    hosted_cluster.start_nodes(everyone)
    wait_in_sync(run.settings)
    run.wait_running()
    check(run, run.finish("SIGKILL of all three nodes, then all restarted"))


def hold(run: FaultRun, seconds: float) -> None:
    """A fault lasts a fixed time; the workers must stay up through it."""
    end = time.monotonic() + seconds
    wait_until(
        lambda: time.monotonic() >= end,
        timeout=seconds + 5,
        what="the fault's time to pass",
        watch=run.workers,
        interval=0.5,
    )


def test_the_coordinator_cut_off_from_the_clients_for_30_s(
    run: FaultRun, hosted_cluster: DevCluster, host_network: HostNetwork
) -> None:
    run.start()
    node_id = coordinator(run.settings, run.group)
    port = hosted_cluster.nodes[node_id - 1].port
    host_network.cut(port)  # from the producer's and both workers' hosts, not from the brokers
    hold(run, CUT_OFF_S)
    # Not a broker partition: the node still replicates, every replica stayed in sync.
    assert out_of_sync(run.settings) == []
    host_network.heal(port)
    run.wait_running()
    counts = run.finish(f"node {node_id} (group coordinator) cut off from all clients for 30 s")
    check(run, counts)


def test_a_worker_host_cut_off_from_the_cluster_for_30_s(
    run: FaultRun, hosted_cluster: DevCluster, host_network: HostNetwork
) -> None:
    run.start()
    ports = [node.port for node in hosted_cluster.nodes]
    host, (isolated, other) = WORKER_HOSTS[0], run.workers
    for port in ports:
        host_network.cut(port, [host])
    cut_ns = time.time_ns()
    hold(run, CUT_OFF_S)  # the other worker takes over the cut-off one's partitions
    for port in ports:
        host_network.heal(port, [host])
    healed_ns = time.time_ns()
    # Runs that had started may still write their lines in the first moments of the cut.
    assert run.runs_of(isolated, cut_ns + 2_000_000_000, healed_ns) == 0
    assert run.runs_of(other, cut_ns + 15_000_000_000, healed_ns) > 0
    run.wait_ran_on(isolated)  # back in the group, with partitions of its own
    run.wait_running()
    check(run, run.finish(f"worker host {host} cut off from all three brokers for 30 s"))
