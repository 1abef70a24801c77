"""(c) Enqueue-to-start latency at a fixed rate: handler start time minus enqueue time."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pipeline import Pipeline

from .app import RECORD_ENV
from .env import fresh_namespace, say, start_worker, stop, tail, worker_command_line
from .report import Section, percentile

if TYPE_CHECKING:
    from pathlib import Path

JOB_TYPE = "bench.latency"
WARM_UP = 200


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _wait_lines(path: Path, count: int, timeout: float, log: Path) -> list[str]:
    deadline = time.monotonic() + timeout
    while len(lines := _lines(path)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {len(lines)} of {count} jobs ran in {timeout:g}s:\n{tail(log)}"
            )
        time.sleep(0.05)
    return lines


def run(bootstrap_servers: str, rate: float, seconds: float, workdir: Path) -> Section:
    settings = fresh_namespace(bootstrap_servers, "latency")
    record, log = workdir / "latency.record", workdir / "latency-worker.log"
    args = ["--priorities", "default"]
    process = start_worker(settings, args, {RECORD_ENV: str(record)}, log)
    total = int(rate * seconds)
    try:
        with Pipeline(settings) as app:
            # Warm up until the worker owns the partitions and runs jobs; not measured.
            for i in range(WARM_UP):
                app.enqueue(JOB_TYPE, {"n": -i, "t": time.time_ns()})
            app.flush(60)
            _wait_lines(record, WARM_UP, 120, log)
            say(f"latency: {total:,} jobs at {rate:g} jobs/s")
            began = time.perf_counter()
            sent = 0
            while sent < total:
                due = min(total, int((time.perf_counter() - began) * rate) + 1)
                while sent < due:
                    app.enqueue(JOB_TYPE, {"n": sent, "t": time.time_ns()})
                    sent += 1
                time.sleep(0.0005)  # pacing between sends, not waiting for a condition
            produced_in = time.perf_counter() - began
            app.flush(60)
        lines = _wait_lines(record, WARM_UP + total, 120, log)
    finally:
        code = stop(process)
    latencies = sorted(int(line) / 1e6 for line in lines[WARM_UP:])
    table = [
        "| jobs | offered rate | p50 | p90 | p99 | max | worker command |",
        "|---:|---:|---:|---:|---:|---:|---|",
        f"| {len(latencies):,} | {total / produced_in:,.0f} jobs/s "
        f"| {percentile(latencies, 0.50):.2f} ms | {percentile(latencies, 0.90):.2f} ms "
        f"| {percentile(latencies, 0.99):.2f} ms | {latencies[-1]:.2f} ms "
        f"| `{worker_command_line(args)}` |",
        "",
        f"The worker exited with code {code} after SIGTERM.",
    ]
    return Section(
        "(c) Enqueue-to-start latency",
        f"One process enqueues `{JOB_TYPE}` jobs one by one with `app.enqueue` at a fixed "
        f"{rate:g} jobs/s for {seconds:g} s, each carrying `time.time_ns()` taken just before "
        "the call; the handler subtracts it from its own start time (same machine, same "
        f"clock). The producer's `linger.ms={settings.producer.linger_ms:g}` is part of the "
        f"latency. {WARM_UP} warm-up jobs are not counted.",
        extra=table,
    )
