"""Multi-step worker scenarios shared by the default tests and their long ``tests/chaos`` versions.

Each scenario runs real worker processes and returns what it observed; the callers assert.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipeline import Pipeline, Priority, Settings

from .harness import (
    GroupOffsets,
    Recording,
    RunEvent,
    TopicPartitionKey,
    WorkerProcess,
    wait_joined,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from .fixtures import WorkerKit

# Killed workers leave a member behind until its session times out; 6 s (the broker's minimum)
# lets a restarted worker get the partitions quickly.
FAST_FAILOVER = {"PIPELINE_WORKER__SESSION_TIMEOUT_MS": "6000"}


# --- A steady producer -------------------------------------------------------------------------


class JobStream:
    """Enqueues jobs at a steady rate from a background thread, with its own producer."""

    def __init__(
        self,
        settings: Settings,
        job_type: str,
        *,
        rate: float,
        total: int | None = None,
        first: int = 0,
        fields: Mapping[str, Any] | None = None,
        tick: float = 0.05,
        priorities: Sequence[str] = (),
        **options: Any,
    ) -> None:
        self.settings = settings
        self.job_type = job_type
        self.rate = rate
        self.total = total
        self.first = first
        self.fields = dict(fields or {})
        self.tick = tick
        self.options = options
        self.priorities = list(priorities)
        """When given, each batch goes to the next of these priorities in turn."""
        self.ids: list[str] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"stream-{job_type}")

    def _run(self) -> None:
        app = Pipeline(self.settings)
        try:
            began = time.monotonic()
            batch = 0
            while not self._stop.is_set():
                due = int((time.monotonic() - began) * self.rate) + 1
                if self.total is not None:
                    due = min(due, self.total)
                if due > len(self.ids):
                    start = self.first + len(self.ids)
                    payloads = ({"n": start + i, **self.fields} for i in range(due - len(self.ids)))
                    options = dict(self.options)
                    if self.priorities:
                        options["priority"] = self.priorities[batch % len(self.priorities)]
                        batch += 1
                    self.ids.extend(app.enqueue_many(self.job_type, payloads, **options))
                    app.flush(60)
                if self.total is not None and len(self.ids) >= self.total:
                    return
                self._stop.wait(self.tick)  # pacing: the next batch is due one tick later
        except BaseException as exc:
            self.error = exc
        finally:
            app.close(60)

    @property
    def finished(self) -> bool:
        """Whether every job was produced (a stream with a ``total`` ends by itself)."""
        return not self._thread.is_alive() and self.error is None

    def cancel(self) -> None:
        """Stop producing without waiting (cleanup path)."""
        self._stop.set()

    def start(self) -> JobStream:
        self._thread.start()
        return self

    def stop(self, timeout: float = 60) -> list[str]:
        """Stop producing; return the ids of every job this stream enqueued (all acknowledged)."""
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the {self.job_type} stream did not stop"
        if self.error is not None:
            raise AssertionError(f"the {self.job_type} stream failed: {self.error!r}") from (
                self.error
            )
        return self.ids


# --- Concurrency seen in the recording ---------------------------------------------------------


def max_overlap(events: Iterable[RunEvent], *, by_partition: bool = False) -> int:
    """The most runs seen between their start and end lines at once (per partition if asked).

    A start line is written after the worker dispatched the job and an end line before it knows
    the job finished, so this never exceeds the real number of jobs in flight.
    """
    open_runs: dict[Any, int] = defaultdict(int)
    highest = 0
    for event in events:
        group = event.tp if by_partition else None
        open_runs[group] += 1 if event.kind == "S" else -1
        highest = max(highest, open_runs[group])
    return highest


# --- SIGKILL -----------------------------------------------------------------------------------


@dataclass
class Kill:
    """What was true when a worker was killed: its pid, the group's commits, its open runs."""

    pid: int
    committed: dict[TopicPartitionKey, int]
    in_flight: set[str]
    finished: int
    time_ns: int


def kill_worker(
    worker: WorkerProcess, offsets: GroupOffsets, recording: Recording, topics: Sequence[str]
) -> Kill:
    """SIGKILL ``worker`` and capture the state it left (nothing changes until a restart)."""
    worker.kill()
    killed_at = time.time_ns()
    committed = offsets.committed(topics)
    recording.refresh()
    finished = sum(1 for e in recording.events if e.kind == "E" and e.pid == worker.pid)
    return Kill(worker.pid, committed, recording.unfinished(pid=worker.pid), finished, killed_at)


@dataclass
class KillReport:
    problems: list[str] = field(default_factory=list)
    reruns: int = 0
    in_flight: int = 0
    uncommitted: int = 0


def check_kills(recording: Recording, kills: Sequence[Kill]) -> KillReport:
    """After the run: every repeated run of a job, and whether a kill allowed it.

    A job may run again only after the worker that ran it was killed, and only if its offset
    was not committed at the kill (offset >= the committed offset then): those are the jobs in
    flight from Kafka's point of view. Any other repeat (after a graceful stop or a rebalance)
    is a problem. Every job whose handler was still running at a kill must run again.
    """
    report = KillReport()
    recording.refresh()
    runs: dict[str, list[RunEvent]] = defaultdict(list)
    for event in recording.events:
        if event.kind == "S":
            runs[event.job_id].append(event)
    killed = {kill.pid: kill for kill in kills}
    for job_id, job_runs in runs.items():
        for run, repeat in zip(job_runs, [*job_runs[1:], None], strict=True):
            where = f"job {job_id} at {run.topic}[{run.partition}]@{run.offset}"
            kill = killed.get(run.pid)
            if kill is None:
                if repeat is not None:
                    report.problems.append(
                        f"{where} ran in pid {run.pid}, which was not killed, and again in pid "
                        f"{repeat.pid}"
                    )
                continue
            uncommitted = run.offset >= kill.committed.get(run.tp, 0)
            report.uncommitted += uncommitted
            if repeat is None:
                if job_id in kill.in_flight:
                    report.problems.append(
                        f"{where} was running in pid {run.pid} when it was killed and never "
                        "ran again (lost)"
                    )
            elif repeat.time_ns < kill.time_ns:
                report.problems.append(
                    f"{where} ran again in pid {repeat.pid} while pid {run.pid} was alive"
                )
            else:
                report.reruns += 1
                if not uncommitted:
                    report.problems.append(
                        f"{where} ran again after pid {run.pid} was killed, though the "
                        f"committed offset was {kill.committed.get(run.tp, 0)}"
                    )
    report.in_flight = sum(len(kill.in_flight) for kill in kills)
    return report


# --- Churn -------------------------------------------------------------------------------------


@dataclass
class ChurnResult:
    ids: list[str]
    joins: int
    leaves: int
    exit_codes: list[int]


def run_churn(
    kit: WorkerKit,
    *,
    jobs: int,
    rate: float,
    phases: Sequence[tuple[int, float]],
    period: float,
    worker_args: Sequence[str],
    job_type: str = "sleepy_async",
    fields: Mapping[str, Any] | None = None,
    timeout: float = 600,
) -> ChurnResult:
    """Stream ``jobs`` jobs while workers join and leave (SIGTERM) every ``period`` seconds.

    ``phases`` is a list of (base worker count, seconds): during a phase (at least four
    membership changes long) a new worker joins
    (and the next step waits until it is a member), then the oldest leaves, alternately, so
    the group size swings between base and base + 1. Afterwards the remaining workers finish
    the backlog and are stopped with SIGTERM. Jobs go to all four priorities in turn.
    """
    recording = kit.recording
    # Jobs on every priority: the assignor balances partition counts, not topics, so a worker
    # may own no partition of some topic; with jobs everywhere every member has work.
    stream = JobStream(
        kit.settings,
        job_type,
        rate=rate,
        total=jobs,
        fields=fields,
        priorities=[p.value for p in Priority],
    ).start()
    running: list[WorkerProcess] = []
    codes: list[int] = []
    joins = leaves = 0

    def join() -> None:
        nonlocal joins
        worker = kit.workers.start(*worker_args, env=FAST_FAILOVER)
        running.append(worker)
        joins += 1
        # A member counts once it is in the group: a SIGTERM while the interpreter still starts
        # would only test Python's default signal handling.
        wait_joined(kit.settings, kit.offsets.group, [worker], stable=False)

    def leave() -> None:
        nonlocal leaves
        oldest = running.pop(0)
        oldest.terminate()
        codes.append(oldest.wait(timeout=90))
        leaves += 1

    try:
        for base, seconds in phases:
            while len(running) < base:
                join()
            phase_end = time.monotonic() + seconds
            growing = True
            changes = 0
            # Each phase makes at least two joins and two leaves however slow rebalances are,
            # and as many more as fit in its seconds.
            while changes < 4 or time.monotonic() < phase_end:
                changes += 1
                # The next change comes after `period` seconds, and only once jobs have moved
                # since the last one: a stuck group fails here instead of churning on.
                wait_until(
                    after(period, recording, stream),
                    timeout=period + 120,
                    what="jobs to make progress between two membership changes",
                    watch=running,
                )
                if growing:
                    join()
                else:
                    leave()
                growing = not growing
        ids = stream.stop(timeout=timeout)
        wait_until(
            lambda: recording.all_finished(ids),
            timeout=timeout,
            what=lambda: f"{len(ids)} jobs to finish ({len(recording.finished_ids)} so far)",
            watch=running,
            interval=0.2,
        )
    finally:
        stream.cancel()
    for worker in running:
        worker.terminate()
    codes.extend(worker.wait(timeout=90) for worker in running)
    return ChurnResult(ids, joins, leaves, codes)


def after(
    period: float, recording: Recording, stream: JobStream | None = None
) -> Callable[[], bool]:
    """A condition: ``period`` seconds passed and one more job finished since now (or every
    job of ``stream`` did, once it is done producing)."""
    mark, progress = time.monotonic(), recording.count("E")

    def due() -> bool:
        if time.monotonic() - mark < period:
            return False
        if recording.count("E") > progress:
            return True
        return stream is not None and stream.finished and recording.all_finished(stream.ids)

    return due
