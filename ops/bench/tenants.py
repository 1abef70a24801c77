"""Tenant fairness: tenant A enqueues a flood, then tenant B a few jobs, same priority, one
worker; how long B's jobs wait (enqueue to start) in read order and with fairness.

``python -m ops.bench.tenants [--flood N] [--late N] [--ms MS] [--concurrency N]
[--wide-buffer N] [--output FILE]`` (``make bench-tenants``: 100,000 then 1,000) runs, in one
run on one broker, each in a namespace of its own: the worker with ``worker.tenants.fairness``
off (read order), on with the default ``buffer_size`` (the look-ahead of docs/tenants.md), and
on with a ``buffer_size`` wide enough to hold the whole flood. A broker is started unless
``PIPELINE_BOOTSTRAP_SERVERS`` is set. The worker is running and idle before the jobs are
enqueued, so it reads A's flood while the producer is still writing it, as in production.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline import Pipeline, Settings
from pipeline._workersettings import WorkerSettings

from .app import RECORD_ENV
from .env import broker, fresh_namespace, machine, say, start_worker, stop, tail
from .report import Section, add_output_option, percentile, without_output, write_sections

JOB_TYPE = "bench.tenant"
CHUNK = 50_000
TITLE = "Tenant fairness"


@dataclass(frozen=True)
class Variant:
    label: str
    fairness: bool
    buffer_size: int


@dataclass(frozen=True)
class Result:
    variant: Variant
    waits_s: list[float]
    """B's waits, enqueue to start, sorted."""
    backlog: int
    """A's jobs not started yet when B's first job was enqueued."""
    flood_before_last: int
    """A's jobs started after B's first enqueue and before B's last start."""
    peak_rss_mb: float
    rate: float
    """Jobs started per second, first to last start (every tenant)."""


def _peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _wait_lines(path: Path, count: int, log: Path, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        lines = _lines(path)
        if len(lines) >= count:
            return lines
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{len(lines)} of {count} jobs started in {timeout:g} s:\n{tail(log)}"
            )
        time.sleep(0.2)


def run_variant(
    bootstrap_servers: str, variant: Variant, args: argparse.Namespace, workdir: Path
) -> Result:
    settings = fresh_namespace(bootstrap_servers, "tenants")
    record, log = workdir / f"{variant.label}.record", workdir / f"{variant.label}.log"
    env = {
        RECORD_ENV: str(record),
        "PIPELINE_WORKER__TENANTS__FAIRNESS": str(variant.fairness).lower(),
        "PIPELINE_WORKER__BUFFER_SIZE": str(variant.buffer_size),
    }
    worker_args = ["--priorities", "default", "--concurrency", str(args.concurrency)]
    process = start_worker(settings, worker_args, env, log)
    try:
        with Pipeline(settings) as app:
            app.enqueue(JOB_TYPE, {"n": -1}, tenant="warmup", priority="default")
            app.flush(60)
            _wait_lines(record, 1, log, 120)  # assigned and running: the flood comes next
            say(f"tenants: {variant.label}: {args.flood:,} jobs of A, then {args.late:,} of B")
            for start in range(0, args.flood, CHUNK):
                payloads = (
                    {"n": n, "ms": args.ms} for n in range(start, min(args.flood, start + CHUNK))
                )
                app.enqueue_many(JOB_TYPE, payloads, tenant="A", priority="default")
            app.enqueue_many(
                JOB_TYPE,
                ({"n": n, "ms": args.ms} for n in range(args.late)),
                tenant="B",
                priority="default",
            )
            app.flush(300)
        lines = _wait_lines(record, 1 + args.flood + args.late, log, 900)
        peak = _peak_rss_mb(process.pid)
    finally:
        code = stop(process)
    if code != 0:
        raise RuntimeError(f"the worker exited with {code}:\n{tail(log)}")
    return _result(variant, [line.split() for line in lines[1:]], peak)


def _result(variant: Variant, rows: list[list[str]], peak_rss_mb: float) -> Result:
    """B's waits and where A's flood stood, from the start lines (warm-up job left out)."""
    starts = [(tenant, int(ns), int(wait)) for tenant, ns, wait in rows]
    late = [(ns, wait) for tenant, ns, wait in starts if tenant == "B"]
    first_enqueue = min(ns - wait for ns, wait in late)
    last_late_start = max(ns for ns, _ in late)
    flood = [ns for tenant, ns, _ in starts if tenant == "A"]
    started_before = sum(1 for ns in flood if ns < first_enqueue)
    during = sum(1 for ns in flood if first_enqueue <= ns <= last_late_start)
    every = [ns for _, ns, _ in starts]
    span = (max(every) - min(every)) / 1e9
    return Result(
        variant,
        sorted(wait / 1e9 for _, wait in late),
        len(flood) - started_before,
        during,
        peak_rss_mb,
        len(every) / span if span > 0 else float("nan"),
    )


def _row(result: Result, partitions: int) -> str:
    v = result.variant
    waits = result.waits_s
    window = partitions * v.buffer_size
    bound = f"{max(0, result.backlog - window // 2) + len(waits):,}" if v.fairness else "—"
    return (
        f"| {v.label} | {v.buffer_size:,} ({window:,}) | {percentile(waits, 0.5):.2f} "
        f"| {percentile(waits, 0.99):.2f} | {waits[-1]:.2f} | {result.backlog:,} "
        f"| {result.flood_before_last:,} | {bound} "
        f"| {result.rate:,.0f} | {result.peak_rss_mb:.0f} |"
    )


def section(
    results: list[Result], args: argparse.Namespace, partitions: int, command: str, kafka: str
) -> Section:
    description = (
        f"Tenant A enqueues {args.flood:,} jobs, then tenant B {args.late:,}, all at priority "
        f"`default` (one topic of {partitions} partitions), to one worker that is already "
        f"running (`--concurrency {args.concurrency}`, each job awaits {args.ms:g} ms, so the "
        "worker, not the producer, is the bottleneck and A's backlog builds while it is "
        "written). B's wait is from its enqueue (`created_at`) to its start. Each line is a "
        "fresh namespace in the same run on the same broker: fairness off (read order), "
        "fairness on with the default `buffer_size` (the look-ahead), and on with a look-ahead "
        "that holds the whole flood. The bound column is docs/tenants.md's for an even "
        "spread: B's last job starts after about `max(0, backlog - P · buffer_size / 2) + B` "
        "of A's starts at most, P the partitions (the producer's sticky partitioner spreads "
        "A's unkeyed jobs only about evenly, and a partition with more than its share "
        "delays B's jobs there by the excess). Jobs/s: every job started, first to last start."
    )
    lines = [
        f"- Command: `{command}`",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {machine()['nproc']} cores, Python {machine()['Python']}, librdkafka "
        f"{machine()['librdkafka']}",
        f"- Kafka: {kafka}",
        "- The broker, the producer and the worker share the machine's cores (with whatever "
        "else runs on it), so rates move between runs: compare the lines of one run.",
        "",
        "| worker | buffer_size (look-ahead, jobs) | B wait p50 s | B wait p99 s | B wait max s "
        "| A's backlog at B's enqueue | A's starts until B's last | bound | jobs/s "
        "| worker peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(result, partitions) for result in results),
        "",
    ]
    return Section(TITLE, description, extra=lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.tenants", description=__doc__)
    parser.add_argument("--flood", type=int, default=100_000, help="tenant A's jobs")
    parser.add_argument("--late", type=int, default=1000, help="tenant B's jobs, after A's")
    parser.add_argument("--ms", type=float, default=2.0, help="each job awaits this long")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--wide-buffer", type=int, default=20_000, help="the buffer_size of the wide look-ahead"
    )
    add_output_option(parser)
    args = parser.parse_args(argv)
    default_buffer = WorkerSettings().buffer_size
    variants = [
        Variant("read order (fairness off)", False, default_buffer),
        Variant("fair, default look-ahead", True, default_buffer),
        Variant("fair, wide look-ahead", True, args.wide_buffer),
    ]
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python -m ops.bench.tenants", *without_output(given)])
    partitions = Settings().topics.partitions
    results = []
    with broker() as kafka, tempfile.TemporaryDirectory(prefix="bench-tenants-") as workdir:
        for variant in variants:
            results.append(run_variant(kafka.bootstrap_servers, variant, args, Path(workdir)))
        description = kafka.description
    result = section(results, args, partitions, command, description)
    write_sections(args.output, [result])
    print(result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
