"""A real local Apache Kafka (KRaft) for development and tests, without Docker.

The broker jars come from Maven Central through Maven (once; cached afterwards) and run on the
machine's Java 17+. Ports: one node serves clients on ``localhost:9092`` (controller 9093); three
nodes on 9092, 9094, 9096 (controllers 9093, 9095, 9097). ``base_port`` shifts them all: node ``i``
(counted from 0, ``node.id`` ``i + 1``) uses ``base_port + 2*i`` and ``base_port + 2*i + 1``.

A data dir holds ``cluster.json`` (what was formatted) and one ``node-<i>/`` per node with
``node.properties``, ``log4j2.yaml``, ``kafka.pid``, ``server.log``, ``stdout.log`` and ``data/``;
a secured cluster (``secure=True``: TLS, SCRAM, ACLs) also ``security/`` (see :mod:`._devsecurity`).

This module is the cluster: the data dir, ``up``, ``down`` and ``status``. The nodes'
configuration is in :mod:`._devnodes`, Java and the jars in :mod:`._devjars`, processes and
ports in :mod:`._devprocs`, the data dir's layout in :mod:`._devdata`, the secured cluster's
certificates and broker settings in :mod:`._devsecurity` and its users in :mod:`._devusers`;
their public names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline._newclient import client
from pipeline._settings import SecuritySettings

from ._devdata import (
    HEAP,
    _Asked,
    _check_ours,
    _held_apart,
    _Layout,
    _prepared,
    _read_layout,
    _saved,
    _wipe,
    default_data_dir,
)
from ._devjars import (
    KAFKA_VERSION,
    LOG4J_SLF4J_VERSION,
    MIN_JAVA_VERSION,
    SCALA_VERSION,
    Progress,
    _format,
    _java_command,
    _quiet,
    default_cache_dir,
    ensure_kafka,
    find_java,
    maven_pom,
    parse_java_version,
)
from ._devnodes import node_properties, plan_nodes, write_node_files
from ._devprocs import (
    _LOCK_FILE,
    STOP_TIMEOUT_S,
    DevBrokerError,
    DevNode,
    PortInUseError,
    _exited_message,
    _file_lock,
    _pid_running,
    _spawn,
    _terminate,
    check_ports_free,
    free_base_port,
    port_is_free,
    port_owner,
    stop_nodes,
)
from ._devsecurity import BROKER_CN, SECURITY_DIR, DevSecurity
from ._devstatus import ClusterStatus, NodeStatus, status
from ._devusers import add_user, client_env, security

# The names this module always offered; most now live in _devnodes, _devjars and _devprocs.
__all__ = [
    "BROKER_CN",
    "DEFAULT_BASE_PORT",
    "HEAP",
    "KAFKA_VERSION",
    "LOG4J_SLF4J_VERSION",
    "MIN_JAVA_VERSION",
    "SCALA_VERSION",
    "SECURITY_DIR",
    "STOP_TIMEOUT_S",
    "ClusterStatus",
    "DevBrokerError",
    "DevCluster",
    "DevNode",
    "NodeStatus",
    "PortInUseError",
    "Progress",
    "add_user",
    "check_ports_free",
    "client_env",
    "client_settings",
    "default_cache_dir",
    "default_data_dir",
    "down",
    "ensure_kafka",
    "find_java",
    "free_base_port",
    "maven_pom",
    "node_properties",
    "parse_java_version",
    "plan_nodes",
    "port_is_free",
    "port_owner",
    "security",
    "status",
    "stop_nodes",
    "up",
]

DEFAULT_BASE_PORT = 9092

# --- Clusters ----------------------------------------------------------------------------------


@dataclass
class DevCluster:
    """A local Kafka cluster started by :func:`up`, with hooks for fault-injection tests."""

    data_dir: Path
    nodes: tuple[DevNode, ...]
    cluster_id: str
    heap: str
    cache_dir: Path | None = None
    already_running: bool = False
    secure: bool = False

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def password_file(self) -> Path:
        """The file that holds the admin's password (of a secured cluster)."""
        return DevSecurity(self.data_dir / SECURITY_DIR).password_file

    def security(self) -> SecuritySettings:
        """The admin's client security settings (``PLAINTEXT`` for a cluster not secured)."""
        return security(self.data_dir)

    def client_settings(self) -> dict[str, str]:
        """The admin's ``PIPELINE_*`` environment variables (see :func:`client_settings`)."""
        return client_settings(self.data_dir)

    def add_user(self, name: str, password: str | None = None) -> SecuritySettings:
        """Creates SCRAM user ``name`` (see :func:`add_user`)."""
        return add_user(name, password, self.data_dir)

    def _client_config(self) -> dict[str, str]:
        return self.security().librdkafka() if self.secure else {}

    def status(self) -> ClusterStatus:
        return status(self.data_dir)

    def down(self, *, purge: bool = False) -> list[int]:
        """Stops every node (see :func:`down`)."""
        return down(self.data_dir, purge=purge)

    def stop_node(self, index: int, hard: bool = False, *, timeout: float = STOP_TIMEOUT_S) -> int:
        """Stops node ``index`` (SIGTERM: clean shutdown; ``hard``: SIGKILL, a crash)."""
        node = self.nodes[index]
        stopped = stop_nodes([node], hard=hard, timeout=timeout)
        if not stopped:
            raise DevBrokerError(f"node {index} of {self.data_dir} is not running")
        return stopped[0]

    def start_node(self, index: int, *, timeout: float = 120.0) -> int:
        """Restarts node ``index`` on its data and waits until it is back in the metadata."""
        return self.start_nodes([index], timeout=timeout)[0]

    def start_nodes(self, indexes: Sequence[int], *, timeout: float = 120.0) -> list[int]:
        """Restarts the nodes ``indexes`` at once (a quorum of them, if all were stopped) and
        waits until each is back in the metadata; returns their pids in that order."""
        nodes = [self.nodes[i] for i in indexes]
        stopped = [node for node in nodes if node.pid() is None]
        started = dict(zip(stopped, self._start(stopped, timeout), strict=True)) if stopped else {}
        return [started.get(node) or node.pid() or 0 for node in nodes]

    def _start(self, nodes: Sequence[DevNode], timeout: float) -> list[int]:
        check_ports_free(nodes)
        java, lib = find_java(), ensure_kafka(cache_dir=self.cache_dir)
        started = {node: _spawn(node, _java_command(java, self.heap, lib, node)) for node in nodes}
        try:
            self._wait_ready(started, time.monotonic() + timeout, timeout)
        except BaseException:
            # Nothing half-started is left behind. These are our own children, known by pid.
            _terminate({pid: node for node, pid in started.items()}, hard=True)
            raise
        return list(started.values())

    def _wait_ready(self, started: dict[DevNode, int], deadline: float, timeout: float) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # Each started broker is asked itself, by a new client that knows no other broker: the
        # cluster may list a killed predecessor until its session expires. log_level 0: refused
        # connections while the JVMs boot are expected, not worth printing.
        conf = {**self._client_config(), "log_level": "0"}

        def ask(node: DevNode) -> Any:
            admin = client(AdminClient, {**conf, "bootstrap.servers": node.address})
            return admin.list_topics(timeout=2)

        waiting = list(started)
        # Nodes stopped on purpose (stop_node) are not waited for.
        wanted = {n.node_id for n in self.nodes if n in started or n.pid() is not None}
        problem = "no answer yet"
        while True:
            for node, pid in started.items():
                # Not node.pid(): a command line reads empty for a moment while exec completes.
                if not _pid_running(pid):
                    raise DevBrokerError(_exited_message(node))
            while waiting:
                node = waiting[0]
                try:
                    metadata = ask(node)
                except KafkaException as exc:
                    problem = f"node {node.index}: {exc.args[0] if exc.args else exc}"
                    break
                seen = set(metadata.brokers)
                if metadata.orig_broker_id != node.node_id or not wanted <= seen:
                    problem = f"node {node.index} sees brokers {sorted(seen)} of {sorted(wanted)}"
                    break
                waiting.pop(0)
            if not waiting:
                return
            if time.monotonic() >= deadline:
                logs = ", ".join(str(n.log_file) for n in started)
                raise DevBrokerError(
                    f"Kafka at {self.bootstrap_servers} did not answer metadata requests with "
                    f"all {len(wanted)} broker(s) within {timeout:.0f}s ({problem}); see {logs}. "
                    "A slow machine may need a longer --timeout."
                )
            time.sleep(0.2)


def up(
    nodes: int | None = None,
    data_dir: Path | None = None,
    base_port: int | None = None,
    heap: str | None = None,
    timeout: float = 120.0,
    *,
    fresh: bool = False,
    cache_dir: Path | None = None,
    progress: Progress = _quiet,
    secure: bool | None = None,
    host: str | None = None,
) -> DevCluster:
    """Starts (or restarts on its data, or reports) the local cluster and waits until it serves.

    ``nodes``, ``base_port`` and ``secure`` default to what ``data_dir`` was formatted with, else
    1, 9092 and not secured; ``fresh`` deletes existing data first. ``timeout`` does not count
    the one-time download. A secured cluster serves clients on ``SASL_SSL`` only; its admin's
    settings are :meth:`DevCluster.security`. ``host`` (default ``localhost``) is the address the
    brokers listen on and advertise, e.g. a local address that other network namespaces reach.
    """
    data_dir = _prepared(data_dir, heap)
    with _file_lock(data_dir / _LOCK_FILE):
        layout = _read_layout(data_dir)
        asked = _Asked(nodes, base_port, secure, host, heap)
        if fresh:
            if layout is not None:
                stop_nodes(plan_nodes(layout.nodes, layout.base_port, data_dir, layout.host))
                asked = asked.like(layout)  # started again empty, as it was
            _wipe(data_dir)
            layout = None
        if layout is not None and asked.conflicts(layout):
            raise _held_apart(data_dir, layout)
        count = layout.nodes if layout else asked.nodes or 1
        port = layout.base_port if layout else asked.base_port or DEFAULT_BASE_PORT
        secured = layout.secure if layout else bool(asked.secure)
        address = layout.host if layout else asked.host or "localhost"
        if secured and address != "localhost":
            raise DevBrokerError("a secured cluster listens on localhost only")
        material = DevSecurity(data_dir / SECURITY_DIR) if secured else None
        if count < 1 or not 1024 <= port <= 65536 - 2 * count:
            raise DevBrokerError(f"cannot place {count} node(s) from port {port}")
        planned = plan_nodes(count, port, data_dir, address)
        stopped = [node for node in planned if node.pid() is None]
        if layout is not None and not stopped:
            return DevCluster(
                data_dir, planned, layout.cluster_id, layout.heap, cache_dir, True, secured
            )
        check_ports_free(stopped)
        java = find_java()
        lib = ensure_kafka(cache_dir=cache_dir, progress=progress)
        chosen_heap = asked.heap or (layout.heap if layout else "1G" if count == 1 else "512m")
        if layout is None:
            _wipe(data_dir)  # leftovers of a format that failed half-way
            if material is not None:
                progress("Generating a CA, the broker certificate and the admin password...")
                material.create()
        if material is not None and not material.exists():
            raise DevBrokerError(
                f"{material.dir} lacks the secured cluster's certificates or admin password; "
                "start over with --fresh"
            )
        for node in planned:  # rewritten each start, so fixes to the defaults reach old data
            write_node_files(node, planned, material)
        if layout is None:
            progress(f"Formatting {count} KRaft node(s) in {data_dir}...")
            cluster_id = _format(java, lib, planned, material.format_args() if material else ())
            layout = _saved(
                data_dir,
                _Layout(count, port, cluster_id, chosen_heap, KAFKA_VERSION, secured, address),
            )
        elif chosen_heap != layout.heap:  # a heap given is kept for the later starts
            layout = _saved(data_dir, dataclasses.replace(layout, heap=chosen_heap))
        cluster = DevCluster(
            data_dir, planned, layout.cluster_id, chosen_heap, cache_dir, secure=secured
        )
        progress(f"Starting {len(stopped)} Kafka {KAFKA_VERSION} node(s)...")
        cluster._start(stopped, timeout)
        return cluster


def down(
    data_dir: Path | None = None,
    *,
    purge: bool = False,
    timeout: float = STOP_TIMEOUT_S,
    hard: bool = False,
) -> list[int]:
    """Stops the brokers started in ``data_dir`` (only those) and returns their pids.

    ``purge`` also deletes the data dir, if it holds nothing but what :func:`up` created.
    ``hard`` kills them (SIGKILL) instead of a clean shutdown: for data that is thrown away.
    """
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    if not data_dir.is_dir():
        return []
    if purge:
        _check_ours(data_dir)  # refused before the lock file is made in someone else's folder
    elif _read_layout(data_dir) is None:
        return []  # no cluster was made here: nothing to stop, and nothing to leave behind
    with _file_lock(data_dir / _LOCK_FILE):
        layout = _read_layout(data_dir)
        stopped: list[int] = []
        if layout is not None:
            planned = plan_nodes(layout.nodes, layout.base_port, data_dir, layout.host)
            stopped = stop_nodes(planned, hard=hard, timeout=timeout)
        if purge:
            _check_ours(data_dir)
            shutil.rmtree(data_dir)
        return stopped


def client_settings(data_dir: Path | None = None) -> dict[str, str]:
    """The ``PIPELINE_*`` environment variables of the admin's client: bootstrap servers and,
    for a secured cluster, ``PIPELINE_SECURITY__*`` (the password too: print it only when asked)."""
    report = status(data_dir)
    if not report.nodes:  # an empty bootstrap list would be exported, and read as unset
        raise DevBrokerError(f"no cluster in {report.data_dir}; start one with `pipeline dev up`")
    return client_env(report.bootstrap_servers, security(report.data_dir))
