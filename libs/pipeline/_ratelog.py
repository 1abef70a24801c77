"""Log lines that may repeat at the rate of messages, limited per key with a count of the rest."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class RateLimitedLog:
    """At most ``burst`` lines per key per ``interval_s``; the next line says how many were held.

    Thread-safe: librdkafka's log lines of one client may be served by any thread that polls it.
    """

    def __init__(self, logger: logging.Logger, *, interval_s: float, burst: int = 1) -> None:
        self._logger = logger
        self._interval = interval_s
        self._burst = burst
        self._windows: dict[str, tuple[float, int, int]] = {}
        self._lock = threading.Lock()

    def log(self, level: int, key: str, msg: str, *args: Any, **kwargs: Any) -> None:
        if not self._logger.isEnabledFor(level):
            return
        now = time.monotonic()
        with self._lock:
            start, logged, suppressed = self._windows.get(key, (-self._interval, 0, 0))
            if now - start >= self._interval:
                start, logged = now, 0
            if logged >= self._burst:
                self._windows[key] = (start, logged, suppressed + 1)
                return
            self._windows[key] = (start, logged + 1, 0)
        if suppressed:
            extra = dict(kwargs.pop("extra", None) or {})
            extra["suppressed"] = suppressed
            kwargs["extra"] = extra
        self._logger.log(level, msg, *args, **kwargs)

    def warning(self, key: str, msg: str, *args: Any, **kwargs: Any) -> None:
        self.log(logging.WARNING, key, msg, *args, **kwargs)

    def error(self, key: str, msg: str, *args: Any, **kwargs: Any) -> None:
        self.log(logging.ERROR, key, msg, *args, **kwargs)
