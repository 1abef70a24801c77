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

``--rounds N`` drains each kind N times (the median run is reported); ``--baseline-ref REF``
also drains both kinds with the worker of commit ``REF`` in every round (see
:mod:`.baseline`), the two workers taking turns going first, and adds a table of both.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from pipeline import Pipeline, Settings

from .app import EXPECTED_ENV, RECORD_ENV
from .baseline import Baseline, BaselineError, baseline_tree
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


def _burst(
    settings: Settings, jobs: int, workdir: Path, label: str, env: Mapping[str, str] | None = None
) -> tuple[float, int]:
    """Run one ``--burst`` worker (``env``: a baseline's, to run its code); return
    (start-to-exit seconds, peak RSS in KB)."""
    record, log = workdir / f"{label}.record", workdir / f"{label}.log"
    began = time.perf_counter()
    process = start_worker(
        settings, ARGS, {RECORD_ENV: str(record), EXPECTED_ENV: str(jobs), **(env or {})}, log
    )
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


Drains = dict[tuple[str, str], list[tuple[float, int]]]
"""(worker, kind) -> every drain's (seconds, peak KB); worker "now" or "before"."""


def _drains(
    bootstrap_servers: str, jobs: int, workdir: Path, rounds: int, baseline: Baseline | None
) -> tuple[Drains, dict[str, tuple[float, int]]]:
    """Every round's drains of both kinds by each worker, then the current worker's restarts
    on the namespaces of its last round."""
    drains: Drains = {}
    last: dict[str, Settings] = {}
    for attempt in range(rounds):
        workers: list[tuple[str, Mapping[str, str]]] = [("now", {})]
        if baseline is not None:
            workers.insert(attempt % 2, ("before", baseline.environ()))
        for worker, env in workers:
            for name in ("plain", "keyed"):
                settings = fresh_namespace(bootstrap_servers, f"dedup-{name}")
                say(f"dedup worker: round {attempt + 1}/{rounds}: enqueueing {jobs:,} {name} jobs")
                _fill(settings, jobs, keyed=name == "keyed")
                say(f"dedup worker: draining them ({worker_command_line(ARGS)}, {worker})")
                label = f"{name}-{worker}-{attempt}"
                drains.setdefault((worker, name), []).append(
                    _burst(settings, jobs, workdir, label, env)
                )
                if worker == "now":
                    last[name] = settings
    restarts = {}
    for name, settings in last.items():
        say(f"dedup worker: a second worker on the drained {name} namespace")
        restarts[name] = _burst(settings, 0, workdir, f"{name}-restart")
    return drains, restarts


def _median(runs: list[tuple[float, int]]) -> tuple[float, int]:
    """The run of the median time (the lower middle one of an even count)."""
    return sorted(runs)[(len(runs) - 1) // 2]


def _compared(jobs: int, drains: Drains, baseline: Baseline) -> list[str]:
    """The table of both workers' drains, and what the change did to the keyed rate."""
    lines = [
        "",
        f"Both workers, every round (the worker of `{baseline.ref}`, {baseline.commit[:12]}: "
        "its `libs` and `services` from `git archive`, first on `PYTHONPATH`, same virtual "
        "environment and bench app; the two take turns going first):",
        "",
        "| worker | no keys, jobs/s | keyed, jobs/s | keyed vs no keys |",
        "|---|---|---|---:|",
    ]
    for worker, label in (("before", f"at {baseline.ref} (before)"), ("now", "now")):
        plain = [jobs / s for s, _ in drains[(worker, "plain")]]
        keyed = [jobs / s for s, _ in drains[(worker, "keyed")]]
        ratio = statistics.median(keyed) / statistics.median(plain)
        lines.append(f"| {label} | {_rates(plain)} | {_rates(keyed)} | {ratio:.0%} |")
    before = statistics.median(jobs / s for s, _ in drains[("before", "keyed")])
    now = statistics.median(jobs / s for s, _ in drains[("now", "keyed")])
    lines += ["", f"Keyed drain now / before, medians: {now / before:.2f}."]
    return lines


def _rates(rates: list[float]) -> str:
    """The median rate, then every run's in order."""
    return f"{statistics.median(rates):,.0f} ({', '.join(f'{r:,.0f}' for r in rates)})"


def run(
    bootstrap_servers: str,
    jobs: int,
    workdir: Path,
    rounds: int = 1,
    baseline: Baseline | None = None,
) -> Section:
    drains, restarts = _drains(bootstrap_servers, jobs, workdir, rounds, baseline)
    results = {f"{name} drain": _median(drains[("now", name)]) for name in ("plain", "keyed")}
    results.update({f"{name} restart": run for name, run in restarts.items()})
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
    if rounds > 1:
        lines.append(f"Drains: the median of {rounds} rounds of each kind.")
    if baseline is not None:
        lines += _compared(jobs, drains, baseline)
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
    parser.add_argument(
        "--rounds", type=int, default=1, help="drains of each kind (the median is reported)"
    )
    parser.add_argument(
        "--baseline-ref", help="also drain both kinds with the worker of this commit"
    )
    add_output_option(parser)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    code = baseline_tree(args.baseline_ref) if args.baseline_ref else contextlib.nullcontext()
    with (
        code as baseline,
        broker() as found,
        tempfile.TemporaryDirectory(prefix="pipeline-bench-") as workdir,
    ):
        section = run(found.bootstrap_servers, args.jobs, Path(workdir), args.rounds, baseline)
    write_sections(args.output, [section])
    print(section.markdown())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BaselineError as exc:  # says what to do: no traceback
        sys.exit(f"python -m ops.bench.dedup_worker: {exc}")
