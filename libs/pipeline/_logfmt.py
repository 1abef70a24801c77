"""Structured log lines: one line per event, with the fields of the record's ``extra``.

Two formats (``log_format``, ``PIPELINE_LOG_FORMAT``): ``text``, ``key=value`` pairs after the
message for people and grep; ``json``, one JSON object per line for log pipelines (Loki,
Elasticsearch, Cloud Logging), a traceback inside its line.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Literal

LogFormat = Literal["text", "json"]

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
        fields = [f"{key}={_value(value)}" for key, value in _extra(record)]
        if fields:
            line = f"{line} {' '.join(fields)}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        if record.stack_info:
            line = f"{line}\n{self.formatStack(record.stack_info)}"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ms), ``level``, ``logger``, ``pid``,
    ``message``, the record's ``extra`` fields (one named like a standard field gets a ``_``
    after its name), then ``exception``/``stack`` as text."""

    def format(self, record: logging.LogRecord) -> str:
        when = time.gmtime(record.created)
        entry: dict[str, object] = {
            "time": f"{time.strftime('%Y-%m-%dT%H:%M:%S', when)}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key, value in _extra(record):
            entry[f"{key}_" if key in entry else key] = value  # never over a standard field
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _extra(record: logging.LogRecord) -> list[tuple[str, object]]:
    return [
        (key, value)
        for key, value in record.__dict__.items()
        if key not in _STANDARD and not key.startswith("_")
    ]


def _value(value: object) -> str:
    text = str(value)
    if not text or any(c in text for c in ' "=\n'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


def log_format_from_env() -> LogFormat:
    """``PIPELINE_LOG_FORMAT`` before the settings are read (an unknown value: ``text`` until
    the settings' own check refuses it)."""
    value = os.environ.get("PIPELINE_LOG_FORMAT", "text").strip().lower()
    return "json" if value == "json" else "text"


def configure_logging(level: str, log_format: LogFormat | None = None) -> None:
    """Send every log line to stderr at ``level``, as ``log_format`` (None: from the
    environment) says."""
    fmt = log_format_from_env() if log_format is None else log_format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
