"""The cron table of the leader: schedules, their last handled fire, and what is due now."""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass

from pipeline._errors import ConfigurationError
from pipeline._records import Schedule
from pipeline._schedule import due_fires, fires_between, next_fire_ms, validate_schedule

_log = logging.getLogger("pipeline.scheduler.cron")


@dataclass(frozen=True, slots=True)
class Fire:
    """One fire to enqueue (``fire_ms``) and the last fire handled once it is (``last_ms``)."""

    schedule: Schedule
    fire_ms: int | None
    last_ms: int


class CronTable:
    """Schedules by name and the next fire of each; :meth:`due` applies the missed policy."""

    def __init__(self, grace_ms: int, max_catchup: int) -> None:
        self._schedules: dict[str, Schedule] = {}
        self._last: dict[str, int] = {}
        self._next: list[tuple[int, str]] = []
        self._planned: dict[str, int] = {}
        self._grace_ms = grace_ms
        self._max_catchup = max_catchup
        self.removed: list[str] = []

    def load_last_fires(self, last_fires: dict[str, int]) -> None:
        self._last.update(last_fires)

    def put(self, name: str, schedule: Schedule | None) -> None:
        """Add, change (``schedule``) or remove (``None``) a schedule."""
        if schedule is None:
            if self._schedules.pop(name, None) is not None:
                self._last.pop(name, None)
                self._planned.pop(name, None)
                self.removed.append(name)
            return
        try:
            validate_schedule(schedule.cron, schedule.timezone, schedule.missed)
        except ConfigurationError as exc:
            _log.error("schedule ignored", extra={"schedule": name, "error": str(exc)})
            self._schedules.pop(name, None)
            self._planned.pop(name, None)
            return
        self._schedules[name] = schedule
        self._last.setdefault(name, schedule.created_at)
        self._plan(name)

    def _plan(self, name: str) -> None:
        schedule = self._schedules[name]
        if schedule.enabled:
            when = next_fire_ms(schedule.cron, schedule.timezone, self._last[name])
            self._planned[name] = when
            heapq.heappush(self._next, (when, name))
        else:
            self._planned.pop(name, None)

    def next_due(self) -> int | None:
        while self._next:
            when, name = self._next[0]
            if self._planned.get(name) == when:
                return when
            heapq.heappop(self._next)
        return None

    def due(self, now: int) -> list[Fire]:
        """Fires to enqueue now; each schedule's last fire moves to its newest past fire time."""
        fires: list[Fire] = []
        while self._next and self._next[0][0] <= now:
            when, name = heapq.heappop(self._next)
            schedule = self._schedules.get(name)
            if schedule is None or self._planned.get(name) != when:
                continue  # removed, disabled or changed since this entry was planned
            last = self._last[name]
            times = due_fires(
                schedule.cron,
                schedule.timezone,
                last,
                now,
                schedule.missed,
                grace_ms=self._grace_ms,
                limit=self._max_catchup,
            )
            newest = fires_between(schedule.cron, schedule.timezone, last, now, 1)
            new_last = newest[-1] if newest else last
            if not times:
                fires.append(Fire(schedule, None, new_last))
            for fire_ms in times:
                fires.append(Fire(schedule, fire_ms, new_last))
            self._last[name] = new_last
            self._plan(name)
        return fires

    def schedules(self) -> dict[str, Schedule]:
        return dict(self._schedules)

    def __len__(self) -> int:
        return len(self._schedules)
