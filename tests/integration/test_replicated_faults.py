"""The short version of ``tests/chaos/test_replicated_faults.py``: on 3 local nodes (replication
3, ``min.insync.replicas=2``), the worker group's coordinator is SIGKILLed and restarted under
continuous produce and two workers; every acknowledged job runs (lost = 0)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.faults.cluster import coordinator, wait_in_sync
from tests.faults.fixtures import fault_run, local_cluster

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pipeline_cli.devbroker import DevCluster
    from tests.faults.run import FaultRun

__all__ = ["local_cluster"]


@pytest.fixture
def run(local_cluster: DevCluster, namespace: str, tmp_path: Path) -> Iterator[FaultRun]:
    yield from fault_run(local_cluster, namespace, tmp_path, None)


@pytest.mark.slow
def test_the_coordinator_sigkilled_and_restarted_loses_no_acknowledged_job(
    run: FaultRun, local_cluster: DevCluster
) -> None:
    run.start()
    node_id = coordinator(run.settings, run.group)
    local_cluster.stop_node(node_id - 1, hard=True)
    run.wait_running()
    local_cluster.start_node(node_id - 1)
    wait_in_sync(run.settings)
    run.wait_running()
    counts = run.finish(f"SIGKILL + restart of node {node_id} (group coordinator)")
    assert counts.acknowledged > 0, run.producer_output()
    assert counts.lost == 0, counts
