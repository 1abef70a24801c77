"""The local Kafka runner against real brokers: a three-node cluster, a killed node, the CLI."""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from pipeline import Pipeline, Settings
from pipeline._topicspec import topic_specs
from pipeline_cli import cli, devbroker
from pipeline_cli._dev import dev
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from pipeline_cli.devbroker import DevCluster

TOPIC = f"devbroker-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def cluster(dev_cluster_factory: Callable[..., DevCluster]) -> DevCluster:
    """One three-node cluster for the module: starting one costs tens of seconds."""
    return dev_cluster_factory(nodes=3)


def produce(servers: str, values: list[bytes]) -> None:
    """Produces with acks=all and fails the test unless every message is acknowledged."""
    producer = Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True})
    errors: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for value in values:
        producer.produce(TOPIC, value, on_delivery=delivered)
    assert producer.flush(90) == 0, "messages still unacknowledged after 90 s"
    assert errors == []


def consume_all(servers: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"devbroker-test-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while len(values) < count and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")
    finally:
        consumer.close()
    return values


def wait_for_full_isr(servers: str, timeout: float = 60) -> int:
    """Waits until all three replicas of the test topic are in sync; returns its leader."""
    admin = AdminClient({"bootstrap.servers": servers})
    leaders: list[int] = []

    def in_sync() -> bool:
        topic = admin.list_topics(TOPIC, timeout=10).topics[TOPIC]
        partition = topic.partitions.get(0)
        if topic.error is None and partition is not None and sorted(partition.isrs) == [1, 2, 3]:
            leaders.append(int(partition.leader))
            return True
        return False

    assert wait_for(in_sync, timeout, interval=0.2), f"replicas not all in sync after {timeout} s"
    return leaders[-1]


def test_three_nodes_replicate_with_acks_all(cluster: DevCluster) -> None:
    report = cluster.status()
    assert [n.alive for n in report.nodes] == [True, True, True]
    assert report.bootstrap_servers == cluster.bootstrap_servers
    assert len(cluster.bootstrap_servers.split(",")) == 3

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topic = NewTopic(TOPIC, 1, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])[TOPIC].result(timeout=30)
    wait_for_full_isr(cluster.bootstrap_servers)

    values = [f"first-{i}".encode() for i in range(20)]
    produce(cluster.bootstrap_servers, values)
    assert consume_all(cluster.bootstrap_servers, len(values)) == values


def test_the_cluster_is_formatted_with_transactions_version_2(cluster: DevCluster) -> None:
    """KIP-890's server-side defence against hanging transactions is on: every node reports the
    finalized feature level it loaded (the broker's own words, there is no client API for it)."""

    def finalized(node_log: Path) -> str | None:
        lines = node_log.read_text(errors="replace").splitlines() if node_log.exists() else []
        loaded = [line for line in lines if "Loaded new metadata FinalizedFeatures" in line]
        return loaded[-1] if loaded else None

    assert wait_for(lambda: all(finalized(n.log_file) for n in cluster.nodes), 30)
    for node in cluster.nodes:
        assert "transaction.version=2," in (finalized(node.log_file) or "")


def test_topics_apply_with_replication_three_and_min_isr_two(cluster: DevCluster) -> None:
    namespace = f"rf3{uuid.uuid4().hex[:6]}"
    env = {
        "PIPELINE_BOOTSTRAP_SERVERS": cluster.bootstrap_servers,
        "PIPELINE_NAMESPACE": namespace,
        "PIPELINE_TOPICS__REPLICATION_FACTOR": "3",
        "PIPELINE_TOPICS__MIN_INSYNC_REPLICAS": "2",
    }
    result = CliRunner().invoke(cli, ["topics", "apply"], env=env)
    assert result.exit_code == 0, result.output
    expected = {spec.name for spec in topic_specs(Settings(namespace=namespace))}
    assert f"created {len(expected)} topics" in result.output

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers})
    topics = admin.list_topics(timeout=10).topics
    ours = sorted(name for name in topics if name.startswith(f"{namespace}."))
    assert set(ours) == expected
    for name in ours:
        assert {len(p.replicas) for p in topics[name].partitions.values()} == {3}, name
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in ours]
    for resource, future in admin.describe_configs(resources).items():
        assert future.result(timeout=30)["min.insync.replicas"].value == "2", resource

    again = CliRunner().invoke(cli, ["topics", "apply"], env=env)
    assert again.exit_code == 0, again.output
    assert "nothing to change" in again.output

    app = Pipeline(Settings(bootstrap_servers=cluster.bootstrap_servers, namespace=namespace))
    assert app.submit("t", {"x": 1}, priority="critical").wait(timeout=60).offset == 0


def test_killed_leader_is_survived_and_restarted(cluster: DevCluster) -> None:
    index = wait_for_full_isr(cluster.bootstrap_servers) - 1  # the leader: the hardest case
    killed_pid = cluster.stop_node(index, hard=True)
    assert not cluster.status().nodes[index].alive
    with pytest.raises(ProcessLookupError):
        os.kill(killed_pid, 0)

    # Two replicas remain, which min.insync.replicas=2 accepts once a new leader is elected.
    later = [f"second-{i}".encode() for i in range(20)]
    produce(cluster.bootstrap_servers, later)

    new_pid = cluster.start_node(index)
    assert new_pid != killed_pid
    assert cluster.status().nodes[index].pid == new_pid
    wait_for_full_isr(cluster.bootstrap_servers)
    first = [f"first-{i}".encode() for i in range(20)]
    assert consume_all(cluster.bootstrap_servers, 40) == first + later


def test_down_stops_exactly_the_three_nodes(cluster: DevCluster) -> None:
    pids = [n.pid for n in cluster.status().nodes if n.pid is not None]
    assert len(pids) == 3
    assert cluster.down() == sorted(pids)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(n.alive for n in cluster.status().nodes)
    assert not any(n.pid_file.exists() for n in cluster.nodes)


def test_cli_status_json_of_an_empty_dir(tmp_path: Path) -> None:
    result = CliRunner().invoke(dev, ["status", "--json", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "data_dir": str(tmp_path.resolve()),
        "bootstrap_servers": "",
        "running": False,
        "secure": False,
        "nodes": [],
    }


def test_cli_up_on_a_taken_port_says_which_and_fails(tmp_path: Path) -> None:
    base = devbroker.free_base_port(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", base))
        sock.listen()
        result = CliRunner().invoke(dev, ["up", "--data-dir", str(tmp_path), "--port", str(base)])
    assert result.exit_code == 1
    assert f"port {base} (the broker port of node 0) is already in use" in result.stderr
    assert "Traceback" not in result.output


def test_cli_up_status_down(tmp_path: Path) -> None:
    base = devbroker.free_base_port(1)
    data_dir = tmp_path / "dev"
    options = ["--data-dir", str(data_dir)]
    runner = CliRunner()
    try:
        started = runner.invoke(dev, ["up", *options, "--port", str(base), "--heap", "384m"])
        assert started.exit_code == 0, started.output
        assert started.stdout.splitlines()[-1] == f"localhost:{base}"
        assert f"stop it with `pipeline dev down --data-dir {data_dir}`" in started.stderr

        # Started again empty, on the port and with the heap it had (it was restarted as one
        # node on 9092, with the default heap).
        fresh = runner.invoke(dev, ["up", *options, "--fresh"])
        assert fresh.exit_code == 0, fresh.output
        assert fresh.stdout.splitlines()[-1] == f"localhost:{base}"
        assert json.loads((data_dir / "cluster.json").read_text())["heap"] == "384m"

        again = runner.invoke(dev, ["up", *options, "--json"])
        assert again.exit_code == 0, again.output
        report = json.loads(again.stdout)
        assert report["already_running"] is True
        assert report["bootstrap_servers"] == f"localhost:{base}"

        status = runner.invoke(dev, ["status", *options])
        assert status.exit_code == 0, status.output
        assert "running" in status.stdout
        assert str(base) in status.stdout
    finally:
        stopped = runner.invoke(dev, ["down", *options, "--purge"])
    assert stopped.exit_code == 0, stopped.output
    assert "Stopped Kafka" in stopped.stdout
    assert not data_dir.exists()
