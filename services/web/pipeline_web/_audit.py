"""The audit log of the dashboard's actions: who did what, to which letters or schedule, and
how many were affected.

Every action (one line of JSON) goes to the ``pipeline.web.audit`` logger, and, with
``web.audit_log`` set, is appended to that file too. The line is written after the action,
with its outcome: ``ok`` or the error it raised.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from pipeline._job import now_ms

if TYPE_CHECKING:
    from pathlib import Path

_log = logging.getLogger("pipeline.web.audit")


class AuditLog:
    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()

    def record(
        self,
        who: str,
        action: str,
        *,
        target: dict[str, Any],
        count: int,
        outcome: str = "ok",
    ) -> dict[str, Any]:
        entry = {
            "at": now_ms(),
            "who": who,
            "action": action,
            "target": target,
            "count": count,
            "outcome": outcome,
        }
        line = json.dumps(entry, separators=(",", ":"), ensure_ascii=False)
        _log.info("%s", line)
        if self._path is not None:
            with self._lock, self._path.open("a", encoding="utf-8") as out:
                out.write(line + "\n")
        return entry
