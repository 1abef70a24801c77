"""The data dir of a local cluster: where it is, its ``cluster.json``, what may be deleted."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from ._devprocs import _LOCK_FILE, DevBrokerError
from ._devsecurity import SECURITY_DIR

_LAYOUT_FILE = "cluster.json"
HEAP = re.compile(r"[1-9][0-9]*[kKmMgGtT]?")
"""What ``-Xmx`` takes: a number of bytes, or of kilo-, mega-, giga- or terabytes."""


def default_data_dir() -> Path:
    """``$PIPELINE_DEV_DIR``, else ``$XDG_STATE_HOME/pipeline/dev``, else ``~/.local/state/...``."""
    if env := os.environ.get("PIPELINE_DEV_DIR"):
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "pipeline" / "dev"


@dataclass(frozen=True)
class _Layout:
    """What ``cluster.json`` records: how the data dir was formatted."""

    nodes: int
    base_port: int
    cluster_id: str
    heap: str
    kafka_version: str
    secure: bool = False
    host: str = "localhost"


def _read_layout(data_dir: Path) -> _Layout | None:
    try:
        return _Layout(**json.loads((data_dir / _LAYOUT_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise DevBrokerError(
            f"{data_dir / _LAYOUT_FILE} is unreadable ({exc}); start over with --fresh"
        ) from exc


def _check_ours(data_dir: Path) -> None:
    """Refuses to delete a directory that holds anything this module did not create."""
    foreign = [
        p.name
        for p in data_dir.iterdir()
        if p.name not in (_LAYOUT_FILE, _LOCK_FILE, SECURITY_DIR) and not p.name.startswith("node-")
    ]
    if foreign:
        raise DevBrokerError(
            f"{data_dir} is not a pipeline dev data dir (it holds {', '.join(sorted(foreign))}); "
            "refusing to use or delete it: choose another --data-dir"
        )


def _wipe(data_dir: Path) -> None:
    _check_ours(data_dir)
    for path in data_dir.iterdir():
        if path.name != _LOCK_FILE:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


@dataclass(frozen=True)
class _Asked:
    """What :func:`up` was given (None: not given)."""

    nodes: int | None
    base_port: int | None
    secure: bool | None
    host: str | None
    heap: str | None

    def like(self, layout: _Layout) -> _Asked:
        """For ``layout``'s cluster started again empty: what is not given is its (the heap
        too, for as many nodes)."""
        nodes = layout.nodes if self.nodes is None else self.nodes
        return _Asked(
            nodes,
            layout.base_port if self.base_port is None else self.base_port,
            layout.secure if self.secure is None else self.secure,
            layout.host if self.host is None else self.host,
            self.heap or (layout.heap if nodes == layout.nodes else None),
        )

    def conflicts(self, layout: _Layout) -> bool:
        """Whether it asks for another cluster than the one ``layout`` formatted."""
        given = (self.nodes, self.base_port, self.secure, self.host)
        held = (layout.nodes, layout.base_port, layout.secure, layout.host)
        return any(g is not None and g != h for g, h in zip(given, held, strict=True))


def check_heap(heap: str | None) -> None:
    """Raises :class:`DevBrokerError` for a heap size the JVM would refuse (at every start)."""
    if heap is not None and not HEAP.fullmatch(heap):
        raise DevBrokerError(f"{heap!r} is not a JVM heap size such as 2G, 512m or 1024k")


def _prepared(data_dir: Path | None, heap: str | None) -> Path:
    """The data dir :func:`up` starts in (made if new), once the arguments are checked; a folder
    that is not one is refused before the lock file is made in it."""
    check_heap(heap)
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if _read_layout(data_dir) is None:
        _check_ours(data_dir)
    return data_dir


def _saved(data_dir: Path, layout: _Layout) -> _Layout:
    (data_dir / _LAYOUT_FILE).write_text(json.dumps(dataclasses.asdict(layout), indent=2))
    return layout


def _held_apart(data_dir: Path, layout: _Layout) -> DevBrokerError:
    kind = "secured " if layout.secure else ""
    flags = " --secure" if layout.secure else ""
    return DevBrokerError(
        f"{data_dir} holds a {kind}{layout.nodes}-node cluster on port {layout.base_port} "
        f"({layout.host}); start it with --nodes {layout.nodes} --port {layout.base_port}{flags}, "
        "use another --data-dir, or add --fresh to delete its data"
    )
