"""The nodes of a local cluster: their ports, broker configuration and files on disk."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ._devprocs import DevNode
from ._devsecurity import DevSecurity, write_private


def plan_nodes(
    nodes: int, base_port: int, data_dir: Path, host: str = "localhost"
) -> tuple[DevNode, ...]:
    """The nodes of a cluster: node ``i`` uses ``base_port + 2*i`` and ``base_port + 2*i + 1``;
    brokers listen on ``host`` (controllers always on localhost)."""
    return tuple(
        DevNode(i, base_port + 2 * i, base_port + 2 * i + 1, data_dir / f"node-{i}", host)
        for i in range(nodes)
    )


def node_properties(
    node: DevNode, cluster: Sequence[DevNode], security: DevSecurity | None = None
) -> dict[str, str]:
    """The broker configuration of ``node`` in ``cluster`` (static KRaft quorum of all nodes);
    with ``security``, TLS, SCRAM and the authorizer (see :mod:`._devsecurity`)."""
    replicas = min(3, len(cluster))
    min_isr = 2 if replicas >= 3 else 1
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": ",".join(
            f"{n.node_id}@localhost:{n.controller_port}" for n in cluster
        ),
        "listeners": f"PLAINTEXT://{node.address},CONTROLLER://localhost:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{node.address}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(node.data_path),
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        # The consumer group protocol's session timeout and heartbeat interval are group configs
        # the workers set (pipeline._groupconfig); the broker's default bounds (at least 45 s and
        # 5 s) would refuse a short one. These are the classic protocol's bounds instead.
        "group.consumer.min.session.timeout.ms": "6000",
        "group.consumer.min.heartbeat.interval.ms": "1000",
        # The scheduler's leadership group (classic protocol): its 1.5 s session (6 s minimum).
        "group.min.session.timeout.ms": "1000",
        "num.partitions": "1",
        "default.replication.factor": str(replicas),
        # Few internal partitions: faster startup and group coordination on a small machine.
        "offsets.topic.num.partitions": "10",
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.num.partitions": "10",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        # The cleaner's default 128 MB dedupe buffer is a big share of a small dev heap.
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
    }
    if security is not None:
        props.update(security.broker_properties(node))
    return props


def _log4j2_yaml(node: DevNode) -> str:
    # json.dumps gives a double-quoted string, which YAML reads as the same string.
    log, pattern = json.dumps(str(node.log_file)), json.dumps(f"{node.log_file}.%i")
    return f"""Configuration:
  name: pipeline-dev-kafka
  Appenders:
    RollingFile:
      name: File
      fileName: {log}
      filePattern: {pattern}
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
      Policies:
        SizeBasedTriggeringPolicy:
          size: "10 MB"
      DefaultRolloverStrategy:
        max: 2
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        ref: File
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
      - name: kafka.request.logger
        level: WARN
      - name: state.change.logger
        level: WARN
"""


def write_node_files(
    node: DevNode, cluster: Sequence[DevNode], security: DevSecurity | None = None
) -> None:
    node.dir.mkdir(parents=True, exist_ok=True)
    props = node_properties(node, cluster, security)
    # Backslash is the only escape a value can need here (keys are fixed, values are paths/ports).
    text = "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items())
    # Owner-only: a secured node's configuration holds the admin's password.
    write_private(node.properties_file, text.encode())
    node.log4j_file.write_text(_log4j2_yaml(node))
