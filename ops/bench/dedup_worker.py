"""Idempotency keys in a real worker: drain rate, memory and restore time with N live keys.

``python -m ops.bench.dedup_worker --jobs 1000000`` (``make bench-dedup`` runs it after the
table benchmark). In the same run, against the same broker:

1. baseline: ``N`` no-op jobs without keys, drained by ``pipeline-worker --burst``;
2. keyed: ``N`` no-op jobs with ``N`` distinct idempotency keys, drained the same way: every key
   is then live (TTL one hour) and in ``<ns>.dedup``;
3. restore: a second ``--burst`` worker in each namespace, with nothing left to run: in the
   keyed one it restores the ``N`` keys before it may read a job, in the baseline one nothing.

Reported: jobs/s of both drains (keyed as a ratio of the baseline), the worker's peak RSS
(``VmHWM``) in each run, the restoring worker's start-to-exit time against the baseline's, the
restore itself (the worker logs how long it took), and the goals: keyed jobs drain at 70% of
the unkeyed rate or more, a million keys restore in under 5 s with a peak under 300 MB above
the baseline. The section is written to ``docs/benchmarks.md`` (``--output``) and printed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from pipeline import Pipeline, Settings

from .app import EXPECTED_ENV, RECORD_ENV
from .env import broker, fresh_namespace, say, start_worker, tail, worker_command_line
from .report import Section, add_output_option, goal_line, write_sections

JOB_TYPE = "bench.noop"
ARGS = ["--burst", "--priorities", "default"]
TITLE = "Idempotency keys in a worker"
_RESTORED = re.compile(r"idempotency keys restored.*seconds=([0-9.]+)")


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


def _restore_seconds(log: Path) -> float | None:
    """How long the worker took to restore its keys, by its own log (written from 1 s on)."""
    found = _RESTORED.search(log.read_text(errors="replace")) if log.is_file() else None
    return float(found.group(1)) if found else None


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


def run(bootstrap_servers: str, jobs: int, workdir: Path) -> Section:
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
    restored_s = _restore_seconds(workdir / "keyed-restart.log")
    above_mb = (keyed_restart_kb - plain_restart_kb) / 1024
    per_key = (keyed_restart_kb - plain_restart_kb) * 1024 / jobs
    ratio = plain_s / keyed_s
    restore = "under 1 s (not logged)" if restored_s is None else f"{restored_s:.1f} s"
    lines = [
        "| run | seconds | jobs/s | vs no keys | peak RSS |",
        "|---|---:|---:|---:|---:|",
        f"| drain, no keys | {plain_s:.1f} | {jobs / plain_s:,.0f} | baseline "
        f"| {plain_kb / 1024:.0f} MB |",
        f"| drain, every job keyed | {keyed_s:.1f} | {jobs / keyed_s:,.0f} "
        f"| {ratio:.0%} | {keyed_kb / 1024:.0f} MB |",
        f"| second worker, no keys | {plain_restart_s:.1f} | | baseline "
        f"| {plain_restart_kb / 1024:.0f} MB |",
        f"| second worker, restores {jobs:,} keys | {keyed_restart_s:.1f} | | "
        f"{keyed_restart_s - plain_restart_s:+.1f} s | {keyed_restart_kb / 1024:.0f} MB "
        f"(+{above_mb:.0f} MB) |",
        "",
        f"The restore of the {jobs:,} keys itself (the worker's log, `idempotency keys "
        f"restored`): {restore}. Peak RSS of the restoring worker above the baseline's: "
        f"{above_mb:.0f} MB, {per_key:.0f} bytes per key.",
    ]
    checks = [(f"keyed drain at 70% of the unkeyed rate or more ({ratio:.0%})", ratio >= 0.7)]
    if jobs == 1_000_000:
        checks += [
            (f"restore of 1,000,000 keys under 5 s ({restore})", (restored_s or 99.0) < 5.0),
            (f"its peak under 300 MB above the baseline (+{above_mb:.0f} MB)", above_mb < 300),
        ]
    else:
        lines.append(f"(The restore goals are for 1,000,000 keys; this run had {jobs:,}.)")
    return Section(
        TITLE,
        f"`python -m ops.bench.dedup_worker --jobs {jobs}` (the second half of `make "
        f"bench-dedup`): {jobs:,} no-op jobs drained by `{worker_command_line(ARGS)}`, without "
        f"keys and with {jobs:,} distinct keys, in the same run against the same broker, then "
        "a second worker started on each drained namespace (it restores the keys, finds "
        "nothing to run and exits). Peak RSS is the worker's VmHWM.",
        extra=lines,
        goal=goal_line(checks),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.dedup_worker", description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs, each with its own key")
    add_output_option(parser)
    args = parser.parse_args(argv)
    with broker() as found, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as workdir:
        section = run(found.bootstrap_servers, args.jobs, Path(workdir))
    write_sections(args.output, [section])
    print(section.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
