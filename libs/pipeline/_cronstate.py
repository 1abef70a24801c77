"""The cron records of ``<ns>.scheduler-state``: the last fire each schedule has handled.

The scheduler leader writes ``cron:<name>`` -> ``{"v": 1, "last": fire_ms}`` in the transaction
that enqueues a fire (a tombstone when the schedule is removed); a new leader and
``pipeline status`` read them back. One format, here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ._tablereader import read_table
from ._topics import TopicNames

if TYPE_CHECKING:
    from ._settings import Settings

CRON_PREFIX = "cron:"
FIRST_MS = -62_135_596_800_000
"""0001-01-01T00:00:00Z in epoch milliseconds: no fire time is earlier."""
LAST_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: no fire time is later."""


def cron_key(name: str) -> bytes:
    return f"{CRON_PREFIX}{name}".encode()


def encode_last_fire(fire_ms: int) -> bytes:
    return json.dumps({"v": 1, "last": fire_ms}).encode()


def decode_last_fire(value: bytes) -> int:
    """The last fire time of a record; ``ValueError`` for one of another shape, whatever it
    holds (any writer can put anything on the topic): a fire time must be an integer within
    the years 1 to 9999."""
    try:
        last = json.loads(value)["last"]
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise ValueError(f"not a last-fire record: {type(exc).__name__}") from exc
    if type(last) is not int or not FIRST_MS <= last <= LAST_MS:
        raise ValueError("not a last-fire record: its fire time is not a time of years 1-9999")
    return last


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
        except ValueError:
            continue
    return last
