"""What the handlers of ``apps/recording.py`` wrote: one start and one end line per run."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable
    from pathlib import Path

TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One line of the recording: a handler started (``S``), returned (``E``) or is about to
    raise (``F``)."""

    kind: str
    job_id: str
    time_ns: int
    pid: int
    job_type: str
    topic: str
    partition: int
    offset: int
    key: str
    n: int

    @classmethod
    def parse(cls, line: str) -> RunEvent:
        kind, job_id, time_ns, pid, job_type, topic, partition, offset, key, n = line.split(" ")
        return cls(
            kind,
            job_id,
            int(time_ns),
            int(pid),
            job_type,
            topic,
            int(partition),
            int(offset),
            key,
            int(n),
        )

    @property
    def tp(self) -> TopicPartitionKey:
        return (self.topic, self.partition)


class Recording:
    """The recording file, parsed incrementally (only complete lines are consumed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[RunEvent] = []
        self.start_counts: Counter[str] = Counter()
        self.finished_ids: set[str] = set()
        self.totals: Counter[str] = Counter()
        self._position = 0
        self._partial = b""
        self._lock = threading.Lock()

    def refresh(self) -> list[RunEvent]:
        """Read the lines written since the last call; return them (also kept in ``events``)."""
        with self._lock:
            try:
                with self.path.open("rb") as file:
                    file.seek(self._position)
                    chunk = file.read()
            except FileNotFoundError:
                return []
            self._position += len(chunk)
            data = self._partial + chunk
            complete, _, self._partial = data.rpartition(b"\n")
            if not complete:
                return []
            new = [RunEvent.parse(line) for line in complete.decode().split("\n")]
            self.events.extend(new)
            for event in new:
                self.totals[event.kind] += 1
                if event.kind == "S":
                    self.start_counts[event.job_id] += 1
                elif event.kind == "E":
                    self.finished_ids.add(event.job_id)
            return new

    def starts(self, job_type: str | None = None) -> list[RunEvent]:
        self.refresh()
        return [
            e for e in self.events if e.kind == "S" and (job_type is None or e.job_type == job_type)
        ]

    def ends(self, job_type: str | None = None) -> list[RunEvent]:
        self.refresh()
        return [
            e for e in self.events if e.kind == "E" and (job_type is None or e.job_type == job_type)
        ]

    def count(self, kind: str = "S", job_type: str | None = None) -> int:
        self.refresh()
        if job_type is None:
            return self.totals[kind]
        return sum(
            1
            for e in self.events
            if e.kind == kind and (job_type is None or e.job_type == job_type)
        )

    def run_counts(self) -> Counter[str]:
        """How many times each job id started."""
        self.refresh()
        return Counter(self.start_counts)

    def all_finished(self, job_ids: Iterable[str]) -> bool:
        self.refresh()
        return self.finished_ids.issuperset(job_ids)

    def unfinished(self, pid: int | None = None) -> set[str]:
        """Jobs with more start than end lines (of process ``pid``, or of any process)."""
        self.refresh()
        balance: Counter[str] = Counter()
        for e in self.events:
            if pid is None or e.pid == pid:
                balance[e.job_id] += 1 if e.kind == "S" else -1
        return {job_id for job_id, open_runs in balance.items() if open_runs > 0}


def check_ran(recording: Recording, job_ids: Iterable[str], *, exactly_once: bool) -> list[str]:
    """Problems with the runs of ``job_ids``: never started, never finished, ran twice."""
    expected = set(job_ids)
    starts = recording.run_counts()
    finished = recording.finished_ids
    problems = []
    missing = expected - set(starts)
    if missing:
        problems.append(f"{len(missing)} of {len(expected)} jobs never ran, e.g. {_some(missing)}")
    unfinished = (expected & set(starts)) - finished
    if unfinished:
        problems.append(f"{len(unfinished)} jobs started but never finished: {_some(unfinished)}")
    unknown = set(starts) - expected
    if unknown:
        problems.append(f"{len(unknown)} runs of jobs nobody enqueued: {_some(unknown)}")
    if exactly_once:
        twice = {job_id: n for job_id, n in starts.items() if n > 1}
        if twice:
            problems.append(f"{len(twice)} jobs ran more than once: {_some(twice.items())}")
    return problems


def _some(items: Iterable[Any], limit: int = 5) -> str:
    listed = sorted(items, key=str)
    more = f" (+{len(listed) - limit} more)" if len(listed) > limit else ""
    return ", ".join(map(str, listed[:limit])) + more
