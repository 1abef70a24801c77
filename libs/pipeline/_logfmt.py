"""Structured log lines: one line per event, ``key=value`` fields from the record's ``extra``."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


class KeyValueFormatter(logging.Formatter):
    """``<UTC time> <LEVEL> <logger> [pid] <message> key=value ...``, then any traceback."""

    converter: Callable[[float | None], time.struct_time] = time.gmtime

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s [%(process)d] %(message)s"
        )
        self.datefmt = "%Y-%m-%dT%H:%M:%S"

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None
        line = super().format(record)
        record.exc_info, record.exc_text, record.stack_info = saved
        fields = [
            f"{key}={_value(value)}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")
        ]
        if fields:
            line = f"{line} {' '.join(fields)}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        if record.stack_info:
            line = f"{line}\n{self.formatStack(record.stack_info)}"
        return line


def _value(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def configure_logging(level: str) -> None:
    """Send every log line to stderr in the key=value format at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
