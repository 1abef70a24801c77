"""The data dir of a local cluster: where it is, its ``cluster.json``, what may be deleted."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ._devprocs import _LOCK_FILE, DevBrokerError
from ._devsecurity import SECURITY_DIR

_LAYOUT_FILE = "cluster.json"


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
