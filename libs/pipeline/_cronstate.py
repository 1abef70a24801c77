"""The cron records of ``<ns>.scheduler-state``: the last fire each schedule has handled.

The scheduler leader writes ``cron:<name>`` -> ``{"v": 1, "last": fire_ms}`` in the transaction
that enqueues a fire (a tombstone when the schedule is removed); a new leader and
``pipeline status`` read them back. One format, here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ._schedule import read_table
from ._topics import TopicNames

if TYPE_CHECKING:
    from ._settings import Settings

CRON_PREFIX = "cron:"


def cron_key(name: str) -> bytes:
    return f"{CRON_PREFIX}{name}".encode()


def encode_last_fire(fire_ms: int) -> bytes:
    return json.dumps({"v": 1, "last": fire_ms}).encode()


def decode_last_fire(value: bytes) -> int:
    """Raises ``ValueError``, ``KeyError`` or ``TypeError`` for a record of another shape."""
    return int(json.loads(value)["last"])


def read_last_fires(settings: Settings, timeout: float = 30.0) -> dict[str, int]:
    """Schedule name -> the last fire time (ms) the scheduler handled; unreadable records are
    left out."""
    last: dict[str, int] = {}
    for key, value in read_table(settings, TopicNames(settings.namespace).scheduler_state, timeout):
        if not key.startswith(CRON_PREFIX):
            continue
        name = key[len(CRON_PREFIX) :]
        if value is None:
            last.pop(name, None)
            continue
        try:
            last[name] = decode_last_fire(value)
        except (ValueError, KeyError, TypeError):
            continue
    return last
