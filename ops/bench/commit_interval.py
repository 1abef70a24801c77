"""What the commit interval costs: the drain of :mod:`.drain` at several ``commit_interval_s``.

``python -m ops.bench.commit_interval [--jobs N] [--repeats N] [--intervals S,S,...]`` fills one
topic, then drains it with ``pipeline-worker --burst`` once per interval and repeat, interleaved
(each drain in a consumer group of its own, the order of the intervals rotated every repeat),
and prints each interval's median first-to-last rate against the longest interval's. A shorter
interval narrows what runs again after a crash (the jobs finished since the last commit); the
default is the shortest that costs under 5% of the throughput. A broker is started unless
``PIPELINE_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from .drain import ARGS, Run, _fill, median_run, rates, worker_drain
from .env import broker, footer, fresh_namespace, say, worker_command_line

GOAL = 0.05
"""The most throughput an interval may cost against the longest one."""


def drain_at(
    bootstrap_servers: str,
    jobs: int,
    intervals: list[float],
    repeats: int,
    workdir: Path,
    *,
    commit_every: int | None = None,
) -> dict[float, list[Run]]:
    """Every drain of one filled topic, by interval."""
    settings = fresh_namespace(bootstrap_servers, "commits")
    say(f"commit interval: filling {settings.namespace}.jobs.default with {jobs:,} no-op jobs")
    _fill(settings, jobs)
    runs: dict[float, list[Run]] = {interval: [] for interval in intervals}
    for attempt in range(repeats):
        order = intervals[attempt % len(intervals) :] + intervals[: attempt % len(intervals)]
        for interval in order:
            say(f"commit interval: run {attempt + 1}/{repeats}, commit_interval_s={interval}")
            group = ["--group", f"{settings.namespace}.workers-{interval}-{attempt}"]
            env = {"PIPELINE_WORKER__COMMIT_INTERVAL_S": str(interval)}
            if commit_every is not None:
                env["PIPELINE_WORKER__COMMIT_EVERY"] = str(commit_every)
            runs[interval].append(worker_drain(settings, jobs, [*ARGS, *group], workdir, env))
    return runs


def table(jobs: int, runs: dict[float, list[Run]]) -> list[str]:
    """Markdown rows: each interval's median rate against the longest interval's."""
    longest = max(runs)
    reference = jobs / median_run(runs[longest])[1]
    lines = [
        "| `commit_interval_s` | median jobs/s (first to last job) | vs longest | every run |",
        "|---:|---:|---:|---|",
    ]
    for interval in sorted(runs):
        rate = jobs / median_run(runs[interval])[1]
        every = rates(jobs, runs[interval])
        lines.append(f"| {interval:g} | {rate:,.0f} | {rate / reference:.1%} | {every} |")
    cheap = [i for i in sorted(runs) if jobs / median_run(runs[i])[1] >= (1 - GOAL) * reference]
    lines += [
        "",
        f"Shortest interval within {GOAL:.0%} of the longest ({longest:g} s): {cheap[0]:g} s.",
    ]
    return lines


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.commit_interval",
        description="Drain throughput of pipeline-worker at several commit intervals.",
    )
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs to drain (100,000)")
    parser.add_argument("--repeats", type=int, default=3, help="drains per interval (3)")
    parser.add_argument(
        "--intervals",
        default="0.05,0.1,0.2,0.5,1,10",
        help="commit_interval_s values, comma separated (0.05,0.1,0.2,0.5,1,10)",
    )
    parser.add_argument(
        "--commit-every",
        type=int,
        help="commit_every of every drain (default: the setting's default, 5,000, which at "
        "full speed commits more often than a long interval does)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    intervals = [float(value) for value in args.intervals.split(",")]
    command = " ".join(
        ["python -m ops.bench.commit_interval", *(argv if argv is not None else sys.argv[1:])]
    )
    started = datetime.now(UTC)
    with broker() as kafka, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        runs = drain_at(
            kafka.bootstrap_servers,
            args.jobs,
            intervals,
            args.repeats,
            Path(tmp),
            commit_every=args.commit_every,
        )
        broker_description = kafka.description
    every = f"{args.commit_every:,}" if args.commit_every is not None else "5,000 (default)"
    lines = [
        *table(args.jobs, runs),
        "",
        f"Worker: `{worker_command_line(ARGS)}` with `PIPELINE_WORKER__COMMIT_INTERVAL_S` set, "
        f"`commit_every` {every}, other settings default; {args.jobs:,} jobs, "
        f"{args.repeats} drain(s) per interval.",
        footer(command, broker_description, started),
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
