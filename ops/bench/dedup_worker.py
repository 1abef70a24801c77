"""Idempotency keys in a real worker: drain rate, memory and restore time with N live keys.

``python -m ops.bench.dedup_worker --jobs 1000000`` (``make bench-dedup`` runs it after the
table benchmark). In the same run, against the same broker:

1. baseline: ``N`` no-op jobs without keys, drained by ``pipeline-worker --burst``;
2. keyed: ``N`` no-op jobs with ``N`` distinct idempotency keys, drained the same way: every key
   is then live (TTL one hour) and in ``<ns>.dedup``;
3. restore: a second ``--burst`` worker in each namespace, with nothing left to run: in the
   keyed one it restores the ``N`` keys before it may read a job, in the baseline one nothing.

Reported: jobs/s of both drains (keyed as a ratio of the baseline), the worker's peak RSS
(``VmHWM``) in each run, and the restoring worker's start-to-exit time against the baseline's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from pipeline import Pipeline, Settings

from .app import EXPECTED_ENV, RECORD_ENV
from .env import broker, fresh_namespace, say, start_worker, tail, worker_command_line

JOB_TYPE = "bench.noop"
ARGS = ["--burst", "--priorities", "default"]


def _fill(settings: Settings, jobs: int, *, keyed: bool) -> None:
    with Pipeline(settings) as app:
        for n in range(jobs):
            key = f"order-{n}" if keyed else None
            app.enqueue(JOB_TYPE, {"n": n}, idempotency_key=key)
            if n % 50_000 == 49_999:
                app.flush(120)
        app.flush(120)


def _peak_rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _burst(settings: Settings, jobs: int, workdir: Path, label: str) -> tuple[float, int]:
    """Run one ``--burst`` worker; return (start-to-exit seconds, peak RSS in KB)."""
    record, log = workdir / f"{label}.record", workdir / f"{label}.log"
    began = time.perf_counter()
    process = start_worker(settings, ARGS, {RECORD_ENV: str(record), EXPECTED_ENV: str(jobs)}, log)
    peak = 0
    while process.poll() is None:
        peak = max(peak, _peak_rss_kb(process.pid))
        time.sleep(0.2)
        if time.perf_counter() - began > 1800:
            process.kill()
            raise RuntimeError(f"{label}: the worker did not finish in 30 min:\n{tail(log)}")
    seconds = time.perf_counter() - began
    if process.returncode != 0:
        raise RuntimeError(
            f"{label}: pipeline-worker exited with {process.returncode}:\n{tail(log)}"
        )
    return seconds, peak


def run(bootstrap_servers: str, jobs: int, workdir: Path) -> list[str]:
    results: dict[str, tuple[float, int]] = {}
    for keyed in (False, True):
        name = "keyed" if keyed else "plain"
        settings = fresh_namespace(bootstrap_servers, f"dedup-{name}")
        say(f"dedup worker: enqueueing {jobs:,} {name} jobs")
        _fill(settings, jobs, keyed=keyed)
        say(f"dedup worker: draining them ({worker_command_line(ARGS)})")
        results[f"{name} drain"] = _burst(settings, jobs, workdir, f"{name}-drain")
        say("dedup worker: a second worker on the drained namespace")
        results[f"{name} restart"] = _burst(settings, 0, workdir, f"{name}-restart")
    plain_s, plain_kb = results["plain drain"]
    keyed_s, keyed_kb = results["keyed drain"]
    plain_restart_s, plain_restart_kb = results["plain restart"]
    keyed_restart_s, keyed_restart_kb = results["keyed restart"]
    per_key = (keyed_restart_kb - plain_restart_kb) * 1024 / jobs
    return [
        "## Idempotency keys in a worker",
        "",
        f"`python -m ops.bench.dedup_worker --jobs {jobs}`: {jobs:,} no-op jobs drained by "
        f"`{worker_command_line(ARGS)}`, without keys and with {jobs:,} distinct keys, then a "
        "second worker started on each drained namespace (it restores the keys, finds nothing "
        "to run and exits). Peak RSS is the worker's VmHWM.",
        "",
        "| run | seconds | jobs/s | vs no keys | peak RSS |",
        "|---|---:|---:|---:|---:|",
        f"| drain, no keys | {plain_s:.1f} | {jobs / plain_s:,.0f} | baseline "
        f"| {plain_kb / 1024:.0f} MB |",
        f"| drain, every job keyed | {keyed_s:.1f} | {jobs / keyed_s:,.0f} "
        f"| {plain_s / keyed_s:.0%} | {keyed_kb / 1024:.0f} MB |",
        f"| second worker, no keys | {plain_restart_s:.1f} | | baseline "
        f"| {plain_restart_kb / 1024:.0f} MB |",
        f"| second worker, restores {jobs:,} keys | {keyed_restart_s:.1f} | | "
        f"+{keyed_restart_s - plain_restart_s:.1f} s | {keyed_restart_kb / 1024:.0f} MB |",
        "",
        f"Memory of the restored keys in the worker: {per_key:.0f} bytes per key (peak RSS of "
        "the restoring worker minus the baseline's, over the keys).",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.dedup_worker", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs, each with its own key")
    args = parser.parse_args(argv)
    with broker() as found, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as workdir:
        print("\n".join(run(found.bootstrap_servers, args.jobs, Path(workdir))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
