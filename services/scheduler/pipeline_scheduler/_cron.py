"""The cron table of the leader: schedules, their last handled fire, and what is due now.

A schedule's fires count from :func:`~pipeline._schedule.count_from`: the later of its last
fire and its record's ``created_at``, so the fires of a paused time never fire on resume.

A schedule far behind (a gap with more fires due than ``max_catchup``) catches up over several
steps, ``max_catchup`` fires each, oldest first: :attr:`Fire.until_ms`, written with the last
fire, says up to where, so a new leader goes on where the last step stopped.

A record that cannot be fired (undecodable, an expression croniter rejects, one that never
fires, an unknown time zone...) is logged once, kept in :attr:`CronTable.invalid` with the
reason and skipped; every other schedule goes on. A later record or a tombstone replaces it.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

from pipeline._errors import ConfigurationError
from pipeline._records import Schedule
from pipeline._schedule import (
    ScheduleRecord,
    check_schedule,
    count_from,
    due_fires,
    next_fire_ms,
)

_log = logging.getLogger("pipeline.scheduler.cron")


@dataclass(frozen=True, slots=True)
class Fire:
    """One fire to enqueue (``fire_ms``) and the last fire handled once it is (``last_ms``);
    ``until_ms``: the fires after it up to that time are still to be enqueued (a catch-up
    goes on at the next step)."""

    schedule: Schedule
    fire_ms: int | None
    last_ms: int
    until_ms: int | None = None


class CronTable:
    """Schedules by name and the next fire of each; :meth:`due` applies the missed policy."""

    def __init__(self, grace_ms: int, max_catchup: int) -> None:
        self._schedules: dict[str, Schedule] = {}
        self._last: dict[str, int] = {}
        self._until: dict[str, int] = {}
        """Per schedule catching up: the fires after its last fire up to this time are due."""
        self._next: list[tuple[int, str]] = []
        self._planned: dict[str, int] = {}
        self._grace_ms = grace_ms
        self._max_catchup = max_catchup
        self.removed: list[str] = []
        self.invalid: dict[str, str] = {}
        """Schedules skipped, by name: why each cannot be fired."""

    def load_last_fires(
        self, last_fires: dict[str, int], catch_ups: dict[str, int] | None = None
    ) -> None:
        """The last fires on record and, for a schedule whose catch-up a step left unfinished,
        up to where it goes on."""
        self._last.update(last_fires)
        self._until.update(catch_ups or {})

    def put(self, name: str, schedule: Schedule | None) -> None:
        """Add, change (``schedule``) or remove (``None``) a schedule; skip an unusable one.

        A removed schedule's last fire is kept (its state record is tombstoned at the next
        fire, unless the schedule is added again before): a new leader reads the schedules'
        history after loading the last fires, and a removal there followed by the schedule
        added again must not lose the last fire, or the fires done since it was added again
        would fire again (:func:`count_from` takes the later of it and the record's creation).
        """
        if schedule is None:
            known = self._schedules.pop(name, None) is not None
            if self.invalid.pop(name, None) is not None or known:
                self._planned.pop(name, None)
                self.removed.append(name)
            return
        try:
            check_schedule(schedule)
        except ConfigurationError as exc:
            self._skip(name, str(exc))
            return
        if name in self.removed:
            self.removed.remove(name)  # added again: its last fire stays
        self.invalid.pop(name, None)
        self._schedules[name] = schedule
        self._last.setdefault(name, schedule.created_at)
        self._plan(name)

    def put_record(self, record: ScheduleRecord) -> None:
        """Apply one record read from ``<ns>.schedules`` (see :func:`decode_schedule`)."""
        if record.problem is not None or record.schedule is None:
            self._skip(record.name, record.problem or "no schedule")
        else:
            self.put(record.name, record.schedule)

    def _skip(self, name: str, reason: str) -> None:
        # The last fire stays: a corrected record goes on from it.
        self._schedules.pop(name, None)
        self._planned.pop(name, None)
        self.invalid[name] = reason
        _log.error(
            "invalid schedule skipped: fix or remove it (`pipeline schedules rm`)",
            extra={"schedule": name, "error": reason},
        )

    def _plan(self, name: str) -> None:
        schedule = self._schedules[name]
        if not schedule.enabled:
            self._planned.pop(name, None)
            return
        try:
            when = next_fire_ms(
                schedule.cron, schedule.timezone, count_from(schedule, self._last[name])
            )
        except ConfigurationError as exc:  # it ran out of fires (a year field, say)
            self._skip(name, str(exc))
            return
        self._planned[name] = when
        heapq.heappush(self._next, (when, name))

    def next_due(self) -> int | None:
        while self._next:
            when, name = self._next[0]
            if self._planned.get(name) == when:
                return when
            heapq.heappop(self._next)
        return None

    def due(self, now: int) -> list[Fire]:
        """Fires to enqueue now, at most ``max_catchup`` per schedule (see :func:`due_fires`);
        each schedule's last fire moves to the newest fire handled."""
        fires: list[Fire] = []
        handled: list[str] = []
        while self._next and self._next[0][0] <= now:
            when, name = heapq.heappop(self._next)
            schedule = self._schedules.get(name)
            if schedule is None or self._planned.get(name) != when:
                continue  # removed, disabled or changed since this entry was planned
            del self._planned[name]  # an entry pushed twice is handled once
            try:
                due = due_fires(
                    schedule.cron,
                    schedule.timezone,
                    count_from(schedule, self._last[name]),
                    now,
                    schedule.missed,
                    grace_ms=self._grace_ms,
                    limit=self._max_catchup,
                    until_ms=self._until.pop(name, None),
                )
            except ConfigurationError as exc:
                self._skip(name, str(exc))
                continue
            times: list[int | None] = [*due.fires] or [None]
            fires.extend(Fire(schedule, t, due.last_ms, due.until_ms) for t in times)
            self._last[name] = due.last_ms
            if due.until_ms is not None:
                self._until[name] = due.until_ms
            handled.append(name)
        for name in handled:  # planned after the loop: one unfinished is due again at once
            self._plan(name)
        return fires

    def schedules(self) -> dict[str, Schedule]:
        return dict(self._schedules)

    def __len__(self) -> int:
        return len(self._schedules)
