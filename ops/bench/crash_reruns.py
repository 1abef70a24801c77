"""What runs again after a SIGKILL: jobs over the four priorities, one worker at
``--concurrency 50`` SIGKILLed once about a quarter of them have run, then a worker that drains
the rest.

``python -m ops.bench.crash_reruns [--jobs N] [--kill-after N] [--ms MS]`` (20,000 jobs of
``MS`` = 20 ms each, the kill after 5,000) prints how many jobs ran twice next to the two counts
that bound them: the jobs running at the kill, and those finished within the last commit
interval before it (a commit carries every offset finished above the commit point, so nothing
older should run again). A broker is started unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from pipeline import Pipeline, Priority, Settings

from .app import RECORD_ENV
from .env import (
    broker,
    footer,
    fresh_namespace,
    say,
    start_worker,
    tail,
    worker_command_line,
)

JOB_TYPE = "bench.counted"
FAILOVER = {"PIPELINE_WORKER__SESSION_TIMEOUT_MS": "6000"}
"""The dead member's partitions go to the next worker after 6 s rather than 45 s."""
FIRST = ["--concurrency", "50"]
SECOND = ["--concurrency", "50", "--burst"]

Event = tuple[str, int, int]
"""(``S`` or ``E``, job number, time in ns)."""


def _fill(settings: Settings, jobs: int, ms: float) -> None:
    priorities = list(Priority)
    with Pipeline(settings) as app:
        for index, priority in enumerate(priorities):
            numbers = range(index, jobs, len(priorities))
            app.enqueue_many(JOB_TYPE, ({"n": n, "ms": ms} for n in numbers), priority=priority)
        app.flush(120)


def _events(record: Path) -> list[Event]:
    try:
        text = record.read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            events.append((parts[0], int(parts[1]), int(parts[2])))
    return events


def run(
    bootstrap_servers: str,
    jobs: int,
    kill_after: int,
    ms: float,
    workdir: Path,
    *,
    interval_s: float | None = None,
) -> list[str]:
    """Fill, run, kill, drain; return the report's lines (``interval_s``: the workers'
    ``commit_interval_s``, None: the default)."""
    settings = fresh_namespace(bootstrap_servers, "reruns")
    which = "default" if interval_s is None else "set"
    interval_s = settings.worker.commit_interval_s if interval_s is None else interval_s
    say(f"crash reruns: filling {settings.namespace} with {jobs:,} jobs over the 4 priorities")
    _fill(settings, jobs, ms)
    record = workdir / "reruns.record"
    environ = {
        RECORD_ENV: str(record),
        "PIPELINE_WORKER__COMMIT_INTERVAL_S": str(interval_s),
        **FAILOVER,
    }
    first = start_worker(settings, FIRST, environ, workdir / "first.log")
    began = time.monotonic()
    while sum(1 for kind, _, _ in _events(record) if kind == "E") < kill_after:
        if first.poll() is not None or time.monotonic() - began > 300:
            first.kill()
            raise RuntimeError(f"the first worker stopped early:\n{tail(workdir / 'first.log')}")
        time.sleep(0.005)
    first.kill()
    killed_ns = time.time_ns()
    first.wait(30)
    before = _events(record)
    say(f"crash reruns: SIGKILL after {sum(1 for e in before if e[0] == 'E'):,} jobs ended")
    balance: Counter[int] = Counter()
    for kind, n, _ in before:
        balance[n] += 1 if kind == "S" else -1
    running = {n for n, open_runs in balance.items() if open_runs > 0}
    recent = {n for kind, n, ns in before if kind == "E" and ns >= killed_ns - interval_s * 1e9}
    ended_before = sum(1 for kind, _, _ in before if kind == "E")
    second = start_worker(settings, SECOND, environ, workdir / "second.log")
    code = second.wait(600)
    if code != 0:
        raise RuntimeError(
            f"the draining worker exited with {code}:\n{tail(workdir / 'second.log')}"
        )
    starts = Counter(n for kind, n, _ in _events(record) if kind == "S")
    twice = {n for n, count in starts.items() if count > 1}
    missing = jobs - len(starts)
    unexplained = twice - running - recent
    ended_at = {n: ns for kind, n, ns in before if kind == "E"}
    ages = [killed_ns - ended_at[n] for n in twice if n in ended_at]
    oldest = f"{max(ages) / 1e6:.0f} ms" if ages else "none"
    return [
        "| jobs | ended before the kill | running at the kill | ended within the last "
        "commit interval before it | ran twice | ran twice, neither running nor that recent "
        "| never ran |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {jobs:,} | {ended_before:,} | {len(running):,} | {len(recent):,} | {len(twice):,} "
        f"| {len(unexplained):,} | {missing:,} |",
        "",
        f"Workers: `{worker_command_line(FIRST)}`, SIGKILLed once {kill_after:,} jobs had ended, "
        f"then `{worker_command_line(SECOND)}`; `commit_interval_s` {interval_s:g} ({which}), "
        f"`session_timeout_ms` 6,000; each job sleeps {ms:g} ms. Of the jobs that ran twice, the "
        f"first run of the oldest ended {oldest} before the kill.",
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.crash_reruns",
        description="Jobs that run again after a worker is SIGKILLed in the middle of a drain.",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs (20,000)")
    parser.add_argument(
        "--kill-after", type=int, default=5_000, help="SIGKILL once this many ended (5,000)"
    )
    parser.add_argument("--ms", type=float, default=20.0, help="how long each job sleeps (20 ms)")
    parser.add_argument(
        "--commit-interval", type=float, help="commit_interval_s of both workers (the default)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = " ".join(
        ["python -m ops.bench.crash_reruns", *(argv if argv is not None else sys.argv[1:])]
    )
    started = datetime.now(UTC)
    with broker() as kafka, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        lines = run(
            kafka.bootstrap_servers,
            args.jobs,
            args.kill_after,
            args.ms,
            Path(tmp),
            interval_s=args.commit_interval,
        )
        broker_description = kafka.description
    lines.append(footer(command, broker_description, started))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
