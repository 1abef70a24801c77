"""The local Kafka's brokers on another local address (``devbroker.up(host=...)``), e.g. one
that clients in other network namespaces reach; the controllers stay on localhost."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from pipeline_cli import devbroker
from pipeline_cli.devbroker import DevBrokerError, node_properties, plan_nodes

if TYPE_CHECKING:
    from pathlib import Path


def write_layout(data_dir: Path, host: str) -> None:
    layout = {
        "nodes": 3,
        "base_port": 19092,
        "cluster_id": "AAAAAAAAAAAAAAAAAAAAAA",
        "heap": "512m",
        "kafka_version": devbroker.KAFKA_VERSION,
        "host": host,
    }
    (data_dir / "cluster.json").write_text(json.dumps(layout))


def test_brokers_listen_and_advertise_on_the_host_and_controllers_on_localhost(
    tmp_path: Path,
) -> None:
    nodes = plan_nodes(3, 19092, tmp_path, "10.1.2.1")
    props = node_properties(nodes[1], nodes)
    assert props["listeners"] == "PLAINTEXT://10.1.2.1:19094,CONTROLLER://localhost:19095"
    assert props["advertised.listeners"] == "PLAINTEXT://10.1.2.1:19094"
    assert props["controller.quorum.voters"] == (
        "1@localhost:19093,2@localhost:19095,3@localhost:19097"
    )


def test_status_names_the_host_in_the_bootstrap_servers(tmp_path: Path) -> None:
    write_layout(tmp_path, "10.1.2.1")
    report = devbroker.status(tmp_path)
    assert report.bootstrap_servers == "10.1.2.1:19092,10.1.2.1:19094,10.1.2.1:19096"
    assert report.to_dict()["nodes"][0]["host"] == "10.1.2.1"


def test_a_data_dir_formatted_on_another_host_is_refused(tmp_path: Path) -> None:
    write_layout(tmp_path, "10.1.2.1")
    with pytest.raises(DevBrokerError, match=r"port 19092 \(10\.1\.2\.1\)"):
        devbroker.up(data_dir=tmp_path, host="localhost")


def test_a_secured_cluster_listens_on_localhost_only(tmp_path: Path) -> None:
    with pytest.raises(DevBrokerError, match="localhost only"):
        devbroker.up(1, tmp_path, 19092, secure=True, host="10.1.2.1")
    assert not (tmp_path / "cluster.json").exists()
