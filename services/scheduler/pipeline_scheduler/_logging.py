"""Structured log lines: ``<UTC time> <LEVEL> <logger> [pid] <message> key=value ...``."""

from __future__ import annotations

import logging
import sys
import time

_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)


class KeyValueFormatter(logging.Formatter):
    """One line per event; fields given with ``extra=`` follow the message as key=value."""

    converter = staticmethod(time.gmtime)

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03dZ %(levelname)s %(name)s [%(process)d] %(message)s",
            "%Y-%m-%dT%H:%M:%S",
        )

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        head, sep, tail = line.partition("\n")  # a traceback, if any, stays below the fields
        fields = " ".join(
            f"{key}={_quoted(value)}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")
        )
        return f"{head} {fields}{sep}{tail}" if fields else line


def _quoted(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
