"""The audit log of the dashboard's actions: who did what, to which letters or schedule, and
how many were affected.

Every action (one line of JSON) goes to the ``pipeline.web.audit`` logger, and, with
``web.audit_log`` set, is appended to that file too. The line is written after the action,
with its outcome: ``ok`` or the error it raised. The file is opened for appending once when
the dashboard starts, which refuses to start without it (:class:`ConfigurationError`); a
write that fails later (disk full, the file made read-only) is logged at ERROR, and the
action's answer still goes out: it ran, and a page of error would have it run again.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any

from pipeline._errors import ConfigurationError
from pipeline._failures import utf8_safe
from pipeline._job import now_ms

if TYPE_CHECKING:
    from pathlib import Path

_log = logging.getLogger("pipeline.web.audit")


class AuditLog:
    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._lock = threading.Lock()
        if path is not None:
            try:
                with path.open("a", encoding="utf-8"):
                    pass
            except OSError as exc:
                raise ConfigurationError(
                    f"web.audit_log: cannot append to {path}: {exc.strerror or exc}"
                ) from None

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
        # An error's text may hold what UTF-8 cannot encode (a lone surrogate): escaped.
        line = utf8_safe(json.dumps(entry, separators=(",", ":"), ensure_ascii=False))
        _log.info("%s", line)
        if self._path is not None:
            try:
                with self._lock, self._path.open("a", encoding="utf-8") as out:
                    out.write(line + "\n")
            except OSError as exc:
                _log.error(
                    "could not append %s by %s to the audit log %s: %s (the action ran)",
                    action,
                    who,
                    self._path,
                    exc,
                )
        return entry
