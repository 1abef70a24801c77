"""One core: the drain of :mod:`.drain` by a worker free to run on every core, and by one confined
to a single core, next to the decoding loop, in one run.

A worker's Python code runs under one GIL, so it never uses more than one core for it, but its
threads do: the event loop, the pool thread running the handler and the consumer thread hand
the GIL to each other many times a millisecond, and a thread the operating system wakes on
another core takes longer to get going there (and finds the objects it reads in the other
core's cache). Confined to one core (``taskset``, a cpuset, Kubernetes' static CPU manager),
every hand-off stays on it; what the worker loses is the second core for what runs outside
the GIL (librdkafka's threads, a handler's I/O waits and C code that releases the GIL).

``python -m ops.bench.affinity [--jobs N] [--repeats N] [--output FILE]`` fills one topic, then
drains it ``--repeats`` times with each reader, interleaved (the two workers take turns going
first), each in a consumer group of its own, and replaces its section of docs/benchmarks.md (or
``--output``). The confined worker is started with the benchmark's own affinity set to the last
core it may use (the child inherits it; the broker keeps every core). A broker is started
unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .drain import ARGS, Run, filled, median_run, rates, raw_consume, worker_drain
from .env import footer, say, worker_command_line
from .report import (
    Measurement,
    Section,
    add_output_option,
    goal_line,
    without_output,
    write_sections,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pipeline import Settings

TITLE = "One core per worker process"
GOAL = 0.5
"""The worker-by-stage goal: the worker at half the decoding loop's rate or more."""


@contextlib.contextmanager
def confined(cpu: int | None) -> Iterator[None]:
    """Processes started in the block run on ``cpu`` alone (None: where this one may run)."""
    if cpu is None:
        yield
        return
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})  # this thread only: a child started now inherits it
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


def one_core() -> int:
    """The core a confined worker gets: the last one this process may use."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        raise SystemExit(
            f"python -m ops.bench.affinity: this process may run on {len(allowed)} core(s); "
            "confining the worker to one changes nothing: run it where two or more are allowed"
        )
    return allowed[-1]


def drain_both(
    settings: Settings, jobs: int, repeats: int, workdir: Path, cpu: int
) -> dict[str, list[Run]]:
    """Every drain of the filled topic, by reader: ``decode``, ``free`` and ``confined``."""
    topic = f"{settings.namespace}.jobs.default"
    runs: dict[str, list[Run]] = {"decode": [], "free": [], "confined": []}
    workers: list[tuple[str, int | None]] = [("free", None), ("confined", cpu)]
    for attempt in range(1, repeats + 1):
        say(f"one core: run {attempt}/{repeats}: raw consume loop + decoding every job")
        runs["decode"].append(raw_consume(settings, topic, jobs, decode=True))
        for name, core in workers if attempt % 2 else workers[::-1]:
            say(f"one core: run {attempt}/{repeats}: the worker, {name}")
            group = ["--group", f"{settings.namespace}.workers-{name}-{attempt}"]
            with confined(core):
                runs[name].append(worker_drain(settings, jobs, [*ARGS, *group], workdir, {}))
    return runs


def section(jobs: int, repeats: int, cpu: int, runs: dict[str, list[Run]]) -> Section:
    command = worker_command_line(ARGS)
    decode = Measurement(
        "raw consume loop + JobCodec.decode, first to last message",
        jobs,
        median_run(runs["decode"])[1],
        "Consumer.subscribe(); consume(1000) until all seen; commit() + decode",
    )
    free = Measurement(
        "pipeline-worker, every core, first to last job", jobs, median_run(runs["free"])[1], command
    )
    one = Measurement(
        f"pipeline-worker confined to core {cpu}, first to last job",
        jobs,
        median_run(runs["confined"])[1],
        f"taskset -c {cpu} {command}",
    )
    share_free, share_one = free.rate / decode.rate, one.rate / decode.rate
    return Section(
        TITLE,
        f"{jobs:,} pre-filled no-op jobs in one topic of 6 partitions (as in section (b)), "
        "drained by the raw loop decoding every job, by one worker process free to run on "
        f"every core, and by one confined to core {cpu} (the broker may use every core), "
        f"{repeats} time(s) each, interleaved, each in a consumer group of its own; the table "
        'shows the run with the median first-to-last time. "vs raw": each worker against the '
        "decoding loop. Confined, a worker's threads pass the GIL to each other on one core; "
        "it loses the second core for what runs outside the GIL: librdkafka's threads here, "
        "and a handler's C code that releases the GIL (compression, hashing, numpy), which a "
        "no-op handler does not have.",
        rows=[(decode, None), (free, decode), (one, decode)],
        extra=[
            f"Confined against free: {one.rate / free.rate:.2f}x at the median.",
            f"Every run, jobs/s: decoding loop {rates(jobs, runs['decode'])}; free "
            f"{rates(jobs, runs['free'])}; confined {rates(jobs, runs['confined'])}.",
        ],
        goal=goal_line(
            [
                (f"free, ≥ 50% of the decoding loop ({share_free:.0%})", share_free >= GOAL),
                (f"confined, ≥ 50% of the decoding loop ({share_one:.0%})", share_one >= GOAL),
            ]
        ),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.affinity",
        description="Drain rate of one worker free on every core and confined to one core, next "
        "to the decoding loop (replaces its section of the results file).",
    )
    parser.add_argument("--jobs", type=int, default=200_000, help="jobs to drain (200,000)")
    parser.add_argument("--repeats", type=int, default=5, help="drains of each reader (5)")
    add_output_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1 or args.repeats < 1:
        raise SystemExit("python -m ops.bench.affinity: --jobs and --repeats must be 1 or more")
    cpu = one_core()
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python -m ops.bench.affinity", *without_output(given)])
    started = datetime.now(UTC)
    with filled("affinity", args.jobs) as (kafka, settings, workdir):
        runs = drain_both(settings, args.jobs, args.repeats, workdir, cpu)
        result = section(args.jobs, args.repeats, cpu, runs)
        result.extra += ["", footer(command, kafka.description, started)]
    write_sections(args.output, [result])
    print(result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
