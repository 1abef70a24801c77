"""Producer processes that enqueue every idempotency key several times, interleaved, and what
the recording says of the keys that ran."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from typing import TYPE_CHECKING

from tests.waiting import wait_for

if TYPE_CHECKING:
    from .fixtures import WorkerKit
    from .harness import WorkerProcess
    from .harness.runs import RunEvent, TopicPartitionKey

# One producer process: sends copy c of key i when (i * copies + c) % producers is its number,
# at the default priority or (rotate) at priority c % 4; its jobs take max_ms / 2 to max_ms.
PRODUCER = """
import sys
from pipeline import Pipeline, Priority

number, producers, keys, copies = map(int, sys.argv[1:5])
max_ms, rotate = float(sys.argv[5]), sys.argv[6] == "rotate"
priorities = list(Priority)
app = Pipeline()
for copy in range(copies):
    for i in range(keys):
        if (i * copies + copy) % producers == number:
            payload = {"n": i, "min_ms": max_ms / 2, "max_ms": max_ms}
            options = {"priority": priorities[copy % len(priorities)]} if rotate else {}
            app.enqueue("sleepy", payload, idempotency_key=f"order-{i}", **options)
app.flush(60)
app.close(30)
"""


def start_producers(
    kit: WorkerKit, *, producers: int, keys: int, copies: int, max_ms: float, rotate: bool = False
) -> list[subprocess.Popen[bytes]]:
    """``producers`` processes that send every key ``copies`` times between them (``rotate``:
    copy c at priority c % 4, so each producer sends each key at every priority)."""
    env = kit.workers.environment()
    args = [str(producers), str(keys), str(copies), str(max_ms), "rotate" if rotate else "one"]
    return [
        subprocess.Popen([sys.executable, "-c", PRODUCER, str(n), *args], env=env)
        for n in range(producers)
    ]


def runs_by_key(kit: WorkerKit) -> Counter[int]:
    """How often each key's ``sleepy`` job started."""
    return Counter(e.n for e in kit.recording.starts("sleepy"))


def keys_ran(kit: WorkerKit, keys: int) -> bool:
    """Whether at least ``keys`` distinct keys started."""
    return len(runs_by_key(kit)) >= keys


def running(kit: WorkerKit, workers: list[WorkerProcess]) -> WorkerProcess | None:
    """The worker running the most jobs now (started, not ended), or None if none runs one.

    Killing it hits jobs that cannot have been committed; the tests wait for one, rather than
    kill at a moment a loaded machine may make too late (every key already run and committed).
    """
    now = {w.pid: len(kit.recording.unfinished(w.pid)) for w in workers}
    victim = max(workers, key=lambda w: now[w.pid])
    return victim if now[victim.pid] else None


def kill_one_running(kit: WorkerKit, workers: list[WorkerProcess], keys: int) -> WorkerProcess:
    """Once ``keys`` keys started, SIGKILLs the worker running the most jobs at that moment."""
    victim: WorkerProcess | None = None

    def found() -> bool:
        nonlocal victim
        victim = running(kit, workers) if keys_ran(kit, keys) else None
        return victim is not None

    assert wait_for(found, 120), f"{keys} keys never started, or no job was running after"
    assert victim is not None
    victim.kill()
    return victim


def assert_reruns_were_uncommitted(
    kit: WorkerKit, keys: int, committed_at_kill: dict[int, dict[TopicPartitionKey, int]]
) -> None:
    """Every key ran; a key ran twice only if its first run was on a killed worker (pid ->
    what was committed right after its kill) and not committed; and the kills hit a job."""
    starts = sorted(kit.recording.starts("sleepy"), key=lambda e: e.time_ns)
    runs = Counter(e.n for e in starts)
    assert sorted(runs) == list(range(keys)), "a key never ran"
    first: dict[int, RunEvent] = {}
    for event in starts:
        first.setdefault(event.n, event)
    again = sorted(n for n, count in runs.items() if count > 1)
    for n in again:
        run = first[n]
        committed = committed_at_kill.get(run.pid)
        assert committed is not None, f"key {n} ran twice but its first worker was not killed"
        assert run.offset >= committed[run.tp], (
            f"key {n} ran again after it was committed: "
            f"{[(e.pid, e.topic, e.partition, e.offset, e.job_id) for e in starts if e.n == n]}"
        )
    in_flight = sum(
        1
        for e in starts
        if e.pid in committed_at_kill and e.offset >= committed_at_kill[e.pid][e.tp]
    )
    assert in_flight > 0, "the kills hit no job: nothing was tested"
    assert len(again) <= in_flight
    print(f"{len(again)} keys ran twice; {in_flight} jobs were not committed at the kills")
