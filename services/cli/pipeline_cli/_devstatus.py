"""What ``pipeline dev status`` reports: each node of a data dir's cluster and whether it runs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._devdata import _read_layout, default_data_dir
from ._devnodes import plan_nodes


@dataclass(frozen=True)
class NodeStatus:
    """What ``pipeline dev status`` shows for one node."""

    index: int
    node_id: int
    pid: int | None
    alive: bool
    port: int
    controller_port: int
    log_file: Path
    host: str = "localhost"


@dataclass(frozen=True)
class ClusterStatus:
    """The nodes formatted in a data dir and whether each one runs."""

    data_dir: Path
    nodes: tuple[NodeStatus, ...]
    secure: bool = False

    @property
    def running(self) -> bool:
        return bool(self.nodes) and all(n.alive for n in self.nodes)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        nodes = [
            {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(n).items()}
            for n in self.nodes
        ]
        return {
            "data_dir": str(self.data_dir),
            "bootstrap_servers": self.bootstrap_servers,
            "running": self.running,
            "secure": self.secure,
            "nodes": nodes,
        }


def status(data_dir: Path | None = None) -> ClusterStatus:
    """Each node of the cluster in ``data_dir``: pid, whether it runs, ports and log file."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    layout = _read_layout(data_dir) if data_dir.is_dir() else None
    if layout is None:
        return ClusterStatus(data_dir, ())
    rows = []
    for node in plan_nodes(layout.nodes, layout.base_port, data_dir, layout.host):
        pid = node.pid()
        rows.append(
            NodeStatus(
                node.index,
                node.node_id,
                pid,
                pid is not None,
                node.port,
                node.controller_port,
                node.log_file,
                node.host,
            )
        )
    return ClusterStatus(data_dir, tuple(rows), layout.secure)
