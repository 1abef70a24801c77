"""The cron records of ``<ns>.scheduler-state``: the last fire each schedule has handled.

The scheduler leader writes ``cron:<name>`` -> ``{"v": 1, "last": fire_ms}`` in the transaction
that enqueues a fire (a tombstone when the schedule is removed); a new leader and
``pipeline status`` read them back. A schedule whose catch-up goes on at the next step (more
fires due than one step enqueues) also has ``"until"``: the fires after ``last`` up to that time
are still to be enqueued (readers that know only ``last`` ignore it). One format, here.
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


def encode_last_fire(fire_ms: int, until_ms: int | None = None) -> bytes:
    record: dict[str, int] = {"v": 1, "last": fire_ms}
    if until_ms is not None:
        record["until"] = until_ms
    return json.dumps(record).encode()


def decode_cron_state(value: bytes) -> tuple[int, int | None]:
    """The last fire time of a record and where its catch-up goes on to (None: caught up);
    ``ValueError`` for one of another shape, whatever it holds (any writer can put anything on
    the topic): each must be an integer within the years 1 to 9999, ``until`` after ``last``."""
    try:
        record = json.loads(value)
        last, until = record["last"], record.get("until")
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
        raise ValueError(f"not a last-fire record: {type(exc).__name__}") from exc
    if type(last) is not int or not FIRST_MS <= last <= LAST_MS:
        raise ValueError("not a last-fire record: its fire time is not a time of years 1-9999")
    if until is not None and (type(until) is not int or not last < until <= LAST_MS):
        raise ValueError("not a last-fire record: its catch-up end is not a time after it")
    return last, until


def decode_last_fire(value: bytes) -> int:
    """The last fire time of a record (see :func:`decode_cron_state`)."""
    return decode_cron_state(value)[0]


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
