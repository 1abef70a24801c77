"""Where a drained job's time goes: each thread's CPU time, the time no Python thread used,
and the event loop's hand-offs to and from the pool thread, at several ``concurrency`` settings.

A plain-function job crosses threads twice: the event loop starts up to ``concurrency`` jobs on
the pool, the pool thread runs them and hands the completions back, and the loop finishes them
and starts as many again. Only one of the two holds the GIL at a time, so in a drain they take
turns, and each turn passes the GIL to a thread the operating system has to wake. The hook this
module installs in the worker (``worker`` mode) times every completion batch the loop takes and
reads every thread's CPU time at 20% and 80% of the drain.

``python -m ops.bench.cycles [--jobs N] [--concurrency N ...] [--rounds N] [--output FILE]``: a
broker is started unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set; the section replaces its
namesake in docs/benchmarks.md (or ``--output``) and is printed.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .drain import ARGS, filled, hooked_drain, raw_consume
from .env import (
    HOOK_OUT_ENV,
    footer,
    hooked_parser,
    run_worker_here,
    say,
    worker_command_line,
)
from .report import Section, without_output, write_sections

TITLE = "Where a drained job's time goes"
STEPS = (
    "wall", "loop", "batches", "turns", "pool", "consumer", "librdkafka", "idle", "handoffs",
)  # fmt: skip
"""Per job, in µs: the drain's wall time; the CPU time of the event loop's thread, and of it
what its consumed batches (decoding, starting the first jobs) and its turns (finishing jobs,
starting the next) took; the CPU time of the pool thread, the consumer thread and librdkafka's
threads; the wall time no Python thread used (the GIL free: everyone waiting); and the two
hand-offs of a loop turn (medians), shared out over its jobs."""


@dataclass(frozen=True)
class Cycles:
    rate: float
    per_turn: float
    """Jobs finished per loop turn (median)."""
    steps: dict[str, float]


def _cpu_by_thread() -> dict[str, float]:
    """CPU seconds so far of each thread of this process: Python threads by name, librdkafka's
    threads together as ``librdkafka``."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK")
    cpu: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue  # the thread ended meanwhile
        name = names.get(int(tid)) or ("librdkafka" if comm.startswith("rdk:") else "other")
        if name.startswith("pipeline-pool"):
            name = "pool"
        cpu[name] = cpu.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return cpu


def summarize(
    turns: list[tuple[float, float, float, float, int]],
    snaps: list[tuple[float, int, dict[str, float]]],
    inside: dict[str, float],
) -> dict[str, float]:
    """Per job, between the snapshots taken at 20% and 80% of the drain: wall time, each
    thread's CPU time and the loop's CPU time ``inside`` its two callbacks (``batches``,
    ``turns``); and the loop's turns: jobs a turn and the hand-offs' medians."""
    (t0, done0, cpu0), (t1, done1, cpu1) = snaps
    jobs = done1 - done0
    per_job = {name: (cpu1.get(name, 0.0) - cpu0.get(name, 0.0)) / jobs for name in cpu1}
    middle = [t for t in turns if t0 <= t[2] <= t1] or turns
    per_turn = statistics.median(t[4] for t in middle)
    to_pool = [b[0] - a[3] for a, b in itertools.pairwise(middle)]
    python = sum(per_job.get(n, 0.0) for n in ("MainThread", "pool", "pipeline-consumer"))
    return {
        "wall": (t1 - t0) / jobs,
        "loop": per_job.get("MainThread", 0.0),
        "batches": inside["batches"] / jobs,
        "turns": inside["turns"] / jobs,
        "pool": per_job.get("pool", 0.0),
        "consumer": per_job.get("pipeline-consumer", 0.0),
        "librdkafka": per_job.get("librdkafka", 0.0),
        "idle": max(0.0, (t1 - t0) / jobs - python),
        "per_turn": per_turn,
        "handoffs": (statistics.median(to_pool) + statistics.median(t[2] - t[1] for t in middle))
        / per_turn,
    }


def _run_worker(argv: list[str]) -> None:
    """``worker`` mode: the worker, its loop's turns timed and its threads' CPU time read at
    20% and 80% of the drain; the summary goes to ``$BENCH_HOOK_OUT`` at exit."""
    from pipeline_worker.execute.processor import Processor

    from .app import EXPECTED_ENV

    out = Path(os.environ[HOOK_OUT_ENV])
    jobs = int(os.environ[EXPECTED_ENV])
    marks = [jobs // 5, jobs * 4 // 5]
    turns: list[tuple[float, float, float, float, int]] = []
    snaps: list[tuple[float, int, dict[str, float]]] = []
    inside = {"batches": 0.0, "turns": 0.0}
    """The loop's CPU time in its two callbacks, between the snapshots."""
    complete_batch, on_batch = Processor.complete_batch, Processor.on_batch
    cpu = time.thread_time

    def timed_turn(self: Processor, batch: list[Any]) -> None:
        began, began_cpu = time.monotonic(), cpu()
        first = min(work.started for work, *_ in batch)
        last = max(ended for _, _, ended, _ in batch)
        complete_batch(self, batch)
        turns.append((first, last, began, time.monotonic(), len(batch)))
        if len(snaps) == 1:
            inside["turns"] += cpu() - began_cpu
        if marks and self.finished >= marks[0]:
            marks.pop(0)
            snaps.append((time.monotonic(), self.finished, _cpu_by_thread()))

    def timed_batch(self: Processor, batch: list[Any]) -> None:
        began_cpu = cpu()
        on_batch(self, batch)
        if len(snaps) == 1:
            inside["batches"] += cpu() - began_cpu

    Processor.complete_batch = timed_turn  # type: ignore[method-assign]
    Processor.on_batch = timed_batch  # type: ignore[method-assign]
    atexit.register(lambda: out.write_text(json.dumps(summarize(turns, snaps, inside))))
    run_worker_here(argv)


def _drain(settings: Any, jobs: int, concurrency: int, group: str, work: Path) -> Cycles:
    env = {"PIPELINE_WORKER__CONCURRENCY": str(concurrency)}
    args = [*ARGS, "--group", group]
    rate, out = hooked_drain(settings, jobs, "ops.bench.cycles", args, env=env, work=work)
    summary = json.loads(out)
    return Cycles(rate, summary["per_turn"], {step: summary[step] * 1e6 for step in STEPS})


def section(
    jobs: int, runs: dict[int, list[Cycles]], decoding: list[float], command: str, kafka: str
) -> Section:
    """The report; ``decoding``: µs a job of the raw consume loop decoding every job."""
    lines = [
        "| concurrency | jobs/s | jobs a turn | wall | event loop | loop: batches | loop: turns "
        "| pool thread | consumer thread | librdkafka | no Python thread | hand-offs |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for concurrency, cycles in runs.items():
        rate = statistics.median(c.rate for c in cycles)
        steps = {s: statistics.median(c.steps[s] for c in cycles) for s in STEPS}
        cells = " | ".join(f"{steps[s]:.2f} µs" for s in STEPS)
        lines.append(
            f"| {concurrency} | {rate:,.0f} | {statistics.median(c.per_turn for c in cycles):.0f} "
            f"| {cells} |"
        )
    rounds = len(next(iter(runs.values())))
    description = (
        f"{jobs:,} pre-filled no-op jobs in one topic of 6 partitions, drained {rounds} time(s) "
        f"at each `concurrency` (`PIPELINE_WORKER__CONCURRENCY`), alternating, by "
        f"`{worker_command_line(ARGS)}` with a hook in its event loop. Per job, between 20% and "
        "80% of each drain: the wall time, the CPU time of each thread (`/proc/self/task`), "
        "and of the loop's what its consumed batches (decoding, bookkeeping, starting the first "
        "jobs) and its turns (finishing jobs, starting the next) took (`time.thread_time`); the "
        "wall time that no Python thread used (the GIL free while every thread waited), and of "
        "that the two hand-offs of each turn of the loop (the pool's last completion to the "
        "loop's turn, the turn's end to the pool's next job; medians, shared out over the jobs of "
        "a turn); the median of the drains."
    )
    floor = statistics.median(decoding)
    lines += [
        "",
        f"In the same run the raw consume loop decoding every job (`JobCodec.decode`, as in the "
        f"drain section) took {floor:.2f} µs a job (median of {len(decoding)}): a worker at 50% "
        f"of its rate would take {2 * floor:.2f} µs a job.",
        "",
        footer(command, kafka),
    ]
    return Section(TITLE, description, extra=lines)


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["worker"]:
        _run_worker(given[1:])
        return 0
    parser = hooked_parser("python -m ops.bench.cycles", __doc__, rounds=3)
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[64, 256], help="settings (64 256)"
    )
    args = parser.parse_args(given)
    command = " ".join(["python -m ops.bench.cycles", *without_output(given)])
    runs: dict[int, list[Cycles]] = {c: [] for c in args.concurrency}
    decoding: list[float] = []
    with filled("cycles", args.jobs) as (kafka, settings, tmp):
        topic = f"{settings.namespace}.jobs.default"
        for n in range(1, args.rounds + 1):
            say(f"cycles: round {n}/{args.rounds}: the raw consume loop decoding every job")
            _wall, span = raw_consume(settings, topic, args.jobs, decode=True)
            decoding.append(span / args.jobs * 1e6)
            order = args.concurrency if n % 2 else list(reversed(args.concurrency))
            for concurrency in order:
                say(f"cycles: round {n}/{args.rounds}: concurrency {concurrency}")
                group = f"{settings.namespace}.workers-{concurrency}-{n}"
                runs[concurrency].append(_drain(settings, args.jobs, concurrency, group, tmp))
        description = kafka.description
    result = section(args.jobs, runs, decoding, command, description)
    write_sections(args.output, [result])
    print(result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
