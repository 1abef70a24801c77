"""The scheduler's table on ``<ns>.scheduler-state``: progress per partition, last fire per cron.

Keys are ``offsets:<topic>:<partition>`` (a :class:`SavedProgress`) and ``cron:<name>`` (the
last fire time handled). Values are small JSON documents; only the scheduler reads them, and
every write happens in the transaction that made the change, so the table always matches the
committed offsets and the jobs on the job topics.

Any writer can put anything on the topic: a record of another shape (or one too large to
trust, see :mod:`._progress`) is logged and skipped, and its key counts as unrecorded (the table
reader gives each key's last record only). Taking the lead never fails on one.
:attr:`SchedulerState.skipped` counts them, for
``pipeline_scheduler_state_records_skipped_total`` (:mod:`._metrics`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pipeline._cronstate import decode_cron_state
from pipeline._settings import Settings
from pipeline._tablereader import read_table
from pipeline._topics import TopicNames

from ._progress import MAX_HELD, SavedProgress

_log = logging.getLogger("pipeline.scheduler")


def progress_key(topic: str, partition: int) -> bytes:
    return f"offsets:{topic}:{partition}".encode()


@dataclass(slots=True)
class SchedulerState:
    """The table as a new leader finds it."""

    progress: dict[tuple[str, int], SavedProgress] = field(default_factory=dict)
    last_fires: dict[str, int] = field(default_factory=dict)
    catch_ups: dict[str, int] = field(default_factory=dict)
    """Per schedule whose catch-up a step left unfinished: up to where it goes on."""
    skipped: int = 0
    """Records read and skipped as unreadable (each logged): without its progress record a
    partition starts from its committed offset, without its last fire a schedule from its
    missed-fire policy, so jobs may be released or fired again."""


def load_state(
    settings: Settings, timeout: float = 60.0, *, max_held: int = MAX_HELD
) -> SchedulerState:
    """Read ``<ns>.scheduler-state`` to its end (committed transactions only); a progress
    record naming more than ``max_held`` held offsets is skipped."""
    state = SchedulerState()
    for key, value in read_table(settings, TopicNames(settings.namespace).scheduler_state, timeout):
        kind, _, rest = key.partition(":")
        try:
            if kind == "offsets":
                topic, _, partition = rest.rpartition(":")
                where = (topic, int(partition))
                if value is None:
                    state.progress.pop(where, None)
                else:
                    state.progress[where] = SavedProgress.decode(value, max_held)
            elif kind == "cron":
                last, until = decode_cron_state(value) if value is not None else (None, None)
                state.last_fires.pop(rest, None)
                state.catch_ups.pop(rest, None)
                if last is not None:
                    state.last_fires[rest] = last
                if until is not None:
                    state.catch_ups[rest] = until
            elif value is not None:  # a tombstone of it is the way to get rid of it
                raise ValueError("no scheduler writes this key (neither offsets: nor cron:)")
        except ValueError as exc:  # the decoders raise nothing else, whatever the bytes
            state.skipped += 1
            _log.warning(
                "unreadable scheduler state record skipped: %s",
                exc,
                extra={"key": key[:200], "error": str(exc)},
            )
    return state
