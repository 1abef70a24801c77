"""Fixtures of the fault tests: the client hosts (network namespaces), a replicated 3-node
cluster, and per test a :class:`~tests.faults.run.FaultRun` in a namespace of its own."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from tests.conftest import _wait_for_coordinators, start_dev_cluster, stop_dev_cluster
from tests.integration.worker.harness import Recording, WorkerLauncher
from tests.integration.worker.harness.kafka import drop_admins

from .cluster import REPLICATED_TOPICS
from .netns import HostNetwork, NetworkSetupError
from .run import HOSTS, FaultRun

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pipeline_cli.devbroker import DevCluster


@pytest.fixture(scope="module")
def host_network() -> Iterator[HostNetwork]:
    """The producer's and the two workers' hosts; fails (never skips) where they cannot be made."""
    network = HostNetwork(HOSTS)
    try:
        network.create()
    except NetworkSetupError as exc:
        problems = network.close()
        pytest.fail(f"cannot make the test hosts: {exc} {problems or ''}", pytrace=False)
    try:
        yield network
    finally:
        problems = network.close()
        assert not problems, f"left behind by the test hosts: {problems}"


def _cluster(host: str | None) -> Iterator[DevCluster]:
    data_dir = Path(tempfile.mkdtemp(prefix="pipeline-test-replicated-"))
    try:
        cluster = start_dev_cluster(3, data_dir, host=host)
        _wait_for_coordinators(cluster.bootstrap_servers)
        yield cluster
    finally:
        # No client of this process may go on calling the cluster's address once it is gone
        # (an address of the test hosts' block would then be routed off this machine).
        drop_admins()
        gc.collect()
        stop_dev_cluster(data_dir)


@pytest.fixture(scope="module")
def hosted_cluster(host_network: HostNetwork) -> Iterator[DevCluster]:
    """Three nodes listening on the address the test hosts reach."""
    yield from _cluster(host_network.broker_address)


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[DevCluster]:
    """Three nodes on localhost (no network namespaces)."""
    yield from _cluster(None)


def replicated_settings(cluster: DevCluster, namespace: str) -> Settings:
    return Settings(
        bootstrap_servers=cluster.bootstrap_servers, namespace=namespace, topics=REPLICATED_TOPICS
    )


def fault_run(
    cluster: DevCluster, namespace: str, tmp_path: Path, network: HostNetwork | None
) -> Iterator[FaultRun]:
    """A run of its own namespace; afterwards every node runs again, for the next test."""
    settings = replicated_settings(cluster, namespace)
    recording = Recording(tmp_path / "runs.log")
    launcher = WorkerLauncher(settings, recording.path, tmp_path)
    run = FaultRun(settings, launcher, recording, tmp_path, network=network)
    try:
        yield run
    finally:
        run.close()
        launcher.stop_all()
        if network is not None:
            network.heal_all()
        cluster.start_nodes(range(len(cluster.nodes)))
