"""The local Kafka runner without running Kafka: configuration, pid safety, error messages."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from pipeline._errors import PipelineError
from pipeline_cli import _devprocs, devbroker
from pipeline_cli.devbroker import (
    DevBrokerError,
    PortInUseError,
    node_properties,
    plan_nodes,
)
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def write_layout(data_dir: Path, nodes: int, base_port: int) -> None:
    """What ``up`` records after formatting, so ``down`` and ``status`` know the nodes."""
    layout = {
        "nodes": nodes,
        "base_port": base_port,
        "cluster_id": "AAAAAAAAAAAAAAAAAAAAAA",
        "heap": "1G",
        "kafka_version": devbroker.KAFKA_VERSION,
    }
    (data_dir / "cluster.json").write_text(json.dumps(layout))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not Kafka."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def listener() -> Iterator[int]:
    """A port this test process listens on (the controller port of node 0 at ``port - 1``)."""
    base = devbroker.free_base_port(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", base + 1))
        sock.listen()
        yield base + 1


def test_documented_ports(tmp_path: Path) -> None:
    assert [(n.port, n.controller_port) for n in plan_nodes(1, 9092, tmp_path)] == [(9092, 9093)]
    three = plan_nodes(3, 9092, tmp_path)
    assert [(n.port, n.controller_port) for n in three] == [
        (9092, 9093),
        (9094, 9095),
        (9096, 9097),
    ]
    assert [n.node_id for n in three] == [1, 2, 3]
    assert [n.port for n in plan_nodes(3, 19092, tmp_path)] == [19092, 19094, 19096]


def test_properties_of_one_node(tmp_path: Path) -> None:
    (node,) = nodes = plan_nodes(1, 19092, tmp_path)
    props = node_properties(node, nodes)
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@localhost:19093"
    assert props["listeners"] == "PLAINTEXT://localhost:19092,CONTROLLER://localhost:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://localhost:19092"
    assert props["log.dirs"] == str(tmp_path / "node-0" / "data")
    assert props["auto.create.topics.enable"] == "false"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key
    # Short worker session timeouts are group configs under the consumer group protocol: the
    # dev broker allows what the classic protocol allows (6 s), and a 1 s heartbeat.
    assert props["group.consumer.min.session.timeout.ms"] == "6000"
    assert props["group.min.session.timeout.ms"] == "1000"
    assert props["group.consumer.min.heartbeat.interval.ms"] == "1000"


def test_properties_of_three_nodes(tmp_path: Path) -> None:
    nodes = plan_nodes(3, 19092, tmp_path)
    voters = "1@localhost:19093,2@localhost:19095,3@localhost:19097"
    for node, port in zip(nodes, (19092, 19094, 19096), strict=True):
        props = node_properties(node, nodes)
        assert props["node.id"] == str(node.node_id)
        assert props["controller.quorum.voters"] == voters
        assert (
            props["listeners"] == f"PLAINTEXT://localhost:{port},CONTROLLER://localhost:{port + 1}"
        )
        assert props["advertised.listeners"] == f"PLAINTEXT://localhost:{port}"
        assert props["log.dirs"] == str(tmp_path / f"node-{node.index}" / "data")
        assert props["offsets.topic.replication.factor"] == "3"
        assert props["transaction.state.log.replication.factor"] == "3"
        assert props["transaction.state.log.min.isr"] == "2"


def test_pom_pins_kafka_and_the_log_binding() -> None:
    pom = devbroker.maven_pom("4.1.1")
    assert "<artifactId>kafka_2.13</artifactId><version>4.1.1</version>" in pom
    assert "<artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version>" in pom


def test_stale_pid_file_never_signals_another_process(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    write_layout(tmp_path, 1, 19092)
    (node,) = plan_nodes(1, 19092, tmp_path)
    node.dir.mkdir()
    node.pid_file.write_text(f"{sleeper.pid}\n")

    assert node.pid() is None
    assert devbroker.status(tmp_path).nodes[0].alive is False
    assert devbroker.down(tmp_path) == []
    assert sleeper.poll() is None, "down signalled a process that is not this node's broker"
    assert not node.pid_file.exists()


@pytest.mark.parametrize(("hard", "signalled"), [(False, -15), (True, -9)], ids=["clean", "hard"])
def test_down_stops_a_process_that_is_the_node(tmp_path: Path, hard: bool, signalled: int) -> None:
    # A stand-in with the command line of a broker: argv[0] named java, kafka.Kafka, the file.
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    java.symlink_to(os.path.realpath(sys.executable))
    write_layout(tmp_path, 1, 19092)
    (node,) = plan_nodes(1, 19092, tmp_path)
    node.dir.mkdir()
    code = "import time; time.sleep(300)"
    fake = subprocess.Popen([str(java), "-c", code, "kafka.Kafka", str(node.properties_file)])
    try:
        node.pid_file.write_text(f"{fake.pid}\n")
        # Popen returns as the child's exec begins (vfork): its /proc command line stays empty
        # until the new image has set up its arguments, longer on a loaded machine.
        assert wait_for(lambda: node.pid() == fake.pid, 10), _devprocs._cmdline(fake.pid)
        assert devbroker.status(tmp_path).running

        assert devbroker.down(tmp_path, timeout=10, hard=hard) == [fake.pid]
        # SIGTERM, Kafka's clean shutdown, unless hard: SIGKILL at once
        assert fake.wait(timeout=10) == signalled
        assert not node.pid_file.exists()
    finally:
        fake.kill()
        fake.wait()


def test_taken_port_is_named_with_its_owner(tmp_path: Path, listener: int) -> None:
    with pytest.raises(PortInUseError) as caught:
        devbroker.up(1, tmp_path, base_port=listener - 1)
    message = str(caught.value)
    assert caught.value.port == listener
    assert f"port {listener} (the controller port of node 0) is already in use" in message
    assert f"pid {os.getpid()}" in message
    assert "--port" in message
    assert not (tmp_path / "cluster.json").exists()


def test_missing_java_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DevBrokerError, match="no `java` on PATH") as caught:
        devbroker.find_java()
    assert "openjdk-17-jre-headless" in str(caught.value)
    assert isinstance(caught.value, PipelineError)


def test_old_java_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    java = tmp_path / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    java.chmod(0o755)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DevBrokerError, match=r"is Java 11, but Kafka .* need Java 17\+"):
        devbroker.find_java()


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('Picked up JAVA_TOOL_OPTIONS: -Xss1m\nopenjdk version "21" 2023-09-19', 21),
        ("no version here", None),
    ],
)
def test_java_version_parsing(output: str, major: int | None) -> None:
    assert devbroker.parse_java_version(output) == major


def test_missing_maven_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DevBrokerError, match="install Maven"):
        devbroker.ensure_kafka(cache_dir=tmp_path / "cache")


def test_status_of_an_empty_dir(tmp_path: Path) -> None:
    report = devbroker.status(tmp_path)
    assert report.nodes == ()
    assert not report.running
    assert report.to_dict() == {
        "data_dir": str(tmp_path.resolve()),
        "bootstrap_servers": "",
        "running": False,
        "secure": False,
        "nodes": [],
    }


def test_purge_refuses_a_dir_it_did_not_make(tmp_path: Path) -> None:
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    with pytest.raises(DevBrokerError, match="refusing to use or delete"):
        devbroker.down(tmp_path, purge=True)
    assert keep.read_text() == "mine"
    assert devbroker.down(tmp_path) == []
    with pytest.raises(DevBrokerError, match="refusing to use or delete"):
        devbroker.up(data_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"], "nothing left in it"


def test_default_dirs_follow_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PIPELINE_DEV_DIR", raising=False)
    monkeypatch.delenv("PIPELINE_DEV_CACHE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert devbroker.default_data_dir() == tmp_path / "state" / "pipeline" / "dev"
    assert devbroker.default_cache_dir("4.1.1") == tmp_path / "cache" / "pipeline" / "kafka-4.1.1"
    monkeypatch.setenv("PIPELINE_DEV_DIR", str(tmp_path / "dev"))
    assert devbroker.default_data_dir() == tmp_path / "dev"


def test_a_pid_reused_after_a_broker_exited_is_seen_running(
    sleeper: subprocess.Popen[bytes],
) -> None:
    # A broker this process spawned exited; the system gave its pid to another process since.
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    exited.pid = sleeper.pid
    _devprocs._children[sleeper.pid] = exited
    try:
        assert _devprocs._pid_running(sleeper.pid)
    finally:
        _devprocs._children.pop(sleeper.pid, None)


def test_env_without_a_cluster_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    """``eval "$(pipeline dev env)"`` exported an empty bootstrap list, which reads as unset."""
    from click.testing import CliRunner

    from pipeline_cli._main import cli

    with pytest.raises(DevBrokerError, match=r"no cluster in .*pipeline dev up"):
        devbroker.client_settings(tmp_path / "none")
    result = CliRunner().invoke(cli, ["dev", "env", "--data-dir", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert "no cluster in" in result.output
    assert "export" not in result.output


@pytest.mark.parametrize("heap", ["bogus", "2 G", "0", "-1G", "1.5G"])
def test_a_heap_the_jvm_would_refuse_is_refused_before_anything_is_made(
    tmp_path: Path, heap: str
) -> None:
    """It was written to cluster.json at the format, and every later start failed with it."""
    from click.testing import CliRunner

    from pipeline_cli._main import cli

    data_dir = tmp_path / "dev"
    result = CliRunner().invoke(cli, ["dev", "up", "--data-dir", str(data_dir), "--heap", heap])
    assert result.exit_code == 2
    assert f"{heap!r} is not a JVM heap size" in result.output
    with pytest.raises(DevBrokerError, match="is not a JVM heap size"):
        devbroker.up(data_dir=data_dir, heap=heap)
    assert not data_dir.exists()


@pytest.mark.parametrize("heap", ["2G", "512m", "1024k", "1073741824"])
def test_jvm_heap_sizes_are_taken(heap: str) -> None:
    assert devbroker.HEAP.fullmatch(heap)
