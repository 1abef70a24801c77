"""Worker processes: ``pipeline-worker --processes N`` against one process, on one backlog.

``python -m ops.bench.processes [--jobs N] [--repeats N] [--processes N]`` fills
``<ns>.jobs.default`` (the other priority topics stay empty, as they often are) with jobs of
two handlers, a wait (``bench.wait``: 2 ms awaited, a call to another service) and a
computation (``bench.cpu``: 500 µs holding the GIL), and drains each with
``pipeline-worker --burst --processes 1`` and ``--processes N``, interleaved, each drain in a
consumer group of its own. It reports the median rate from the first job's end to the last's,
the ratio against one process, and how the jobs were shared between the processes: the group's
assignment has to spread ``jobs.default`` itself over the members, not give one member that
topic and the others the empty ones. A broker is started unless ``PIPELINE_BOOTSTRAP_SERVERS``
is set.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pipeline import Pipeline, Settings

from .app import RECORD_ENV
from .env import broker, fresh_namespace, machine, say, start_worker, tail, worker_command_line
from .report import Section, goal_line

CONCURRENCY = 32
HANDLERS = {
    "bench.wait": ("waits 2 ms (asyncio.sleep)", {"ms": 2.0}),
    "bench.cpu": ("computes 500 µs (blake2b, holding the GIL)", {"us": 500.0}),
}


@dataclass(frozen=True)
class Drain:
    """One drain: jobs per second from the first job's end to the last's, jobs per process."""

    rate: float
    shares: tuple[int, ...]


def _args(processes: int, group: str) -> list[str]:
    concurrency = str(CONCURRENCY)
    return [
        "--burst",
        "--processes",
        str(processes),
        "--concurrency",
        concurrency,
        "--group",
        group,
    ]


def _fill(settings: Settings, job_type: str, payload: dict[str, float], jobs: int) -> None:
    with Pipeline(settings) as app:
        app.enqueue_many(job_type, ({"n": i, **payload} for i in range(jobs)))
        app.flush(120)


def _drain(settings: Settings, jobs: int, args: list[str], workdir: Path) -> Drain:
    record, log = workdir / "processes.record", workdir / "processes-worker.log"
    record.unlink(missing_ok=True)
    process = start_worker(settings, args, {RECORD_ENV: str(record)}, log)
    code = process.wait(900)
    if code != 0:
        raise RuntimeError(f"pipeline-worker {' '.join(args)} exited with {code}:\n{tail(log)}")
    ends = [line.split() for line in record.read_text().splitlines()]
    if len(ends) < jobs:
        raise RuntimeError(f"only {len(ends)} of {jobs} jobs ran:\n{tail(log)}")
    times = sorted(int(t) for _, t in ends)
    shares = Counter(pid for pid, _ in ends)
    return Drain(jobs / ((times[-1] - times[0]) / 1e9), tuple(sorted(shares.values())))


def _median(drains: list[Drain]) -> Drain:
    return sorted(drains, key=lambda d: d.rate)[len(drains) // 2]


def measure(
    bootstrap_servers: str, jobs: int, repeats: int, processes: int, workdir: Path
) -> dict[str, dict[int, list[Drain]]]:
    """Every drain, by handler and by number of processes."""
    results: dict[str, dict[int, list[Drain]]] = {}
    for job_type, (_, payload) in HANDLERS.items():
        settings = fresh_namespace(bootstrap_servers, "processes")
        counts = (1, processes)
        results[job_type] = {n: [] for n in counts}
        say(f"processes: filling {settings.namespace}.jobs.default with {jobs:,} {job_type}")
        _fill(settings, job_type, payload, jobs)
        for attempt in range(repeats):
            for n in counts if attempt % 2 == 0 else counts[::-1]:
                say(f"processes: {job_type}, run {attempt + 1}/{repeats}, --processes {n}")
                group = f"{settings.namespace}.workers-{n}-{attempt}"
                results[job_type][n].append(_drain(settings, jobs, _args(n, group), workdir))
    return results


def section(
    jobs: int, repeats: int, processes: int, results: dict[str, dict[int, list[Drain]]]
) -> Section:
    lines = [
        "| handler | processes | median jobs/s | vs 1 process | jobs per process (median run) "
        "| every run, jobs/s |",
        "|---|---:|---:|---:|---|---|",
    ]
    checks = []
    for job_type, by_count in results.items():
        what = HANDLERS[job_type][0]
        one = _median(by_count[1]).rate
        for n, drains in by_count.items():
            median = _median(drains)
            every = ", ".join(f"{d.rate:,.0f}" for d in sorted(drains, key=lambda d: d.rate))
            split = " / ".join(f"{s:,}" for s in median.shares)
            lines.append(
                f"| `{job_type}` ({what}) | {n} | {median.rate:,.0f} | {median.rate / one:.2f}x "
                f"| {split} | {every} |"
            )
        ratio = _median(by_count[processes]).rate / one
        wanted = 1.0 if job_type == "bench.wait" else 1.05
        label = "at least as fast" if job_type == "bench.wait" else "faster"
        checks.append(
            (f"`{job_type}` {processes} processes {label} ({ratio:.2f}x)", ratio >= wanted)
        )
    command = worker_command_line(_args(processes, "<group>"))
    lines += [
        "",
        f"{jobs:,} jobs per handler in `<ns>.jobs.default` (6 partitions; the other priority "
        f"topics empty), {repeats} drain(s) per setting, interleaved. Worker: `{command}` "
        "(and `--processes 1`).",
    ]
    return Section(
        title="Worker processes",
        description=(
            f"`pipeline-worker --processes {processes}` against one process on the same backlog: "
            "the range assignor gives each process its share of every priority topic, so the "
            "busy topic is spread however many topics are empty."
        ),
        extra=lines,
        goal=goal_line(checks),
    )


def run(bootstrap_servers: str, quick: bool, workdir: Path) -> Section:
    """The section of ``make bench`` (small counts with ``quick``)."""
    jobs, repeats = (1_000, 1) if quick else (20_000, 3)
    return section(jobs, repeats, 2, measure(bootstrap_servers, jobs, repeats, 2, workdir))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.processes",
        description="Drain rate of pipeline-worker --processes N against one process.",
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per handler (20,000)")
    parser.add_argument("--repeats", type=int, default=3, help="drains per setting (3)")
    parser.add_argument("--processes", type=int, default=2, help="processes to compare (2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.processes < 2 or args.jobs < 1 or args.repeats < 1:
        raise SystemExit("--processes must be 2 or more, --jobs and --repeats 1 or more")
    command = " ".join(
        ["python -m ops.bench.processes", *(argv if argv is not None else sys.argv[1:])]
    )
    started = datetime.now(UTC)
    with broker() as kafka, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        results = measure(
            kafka.bootstrap_servers, args.jobs, args.repeats, args.processes, Path(tmp)
        )
        broker_description = kafka.description
    facts = machine()
    text = section(args.jobs, args.repeats, args.processes, results).markdown()
    print(text)
    print(
        f"Command: `{command}`; date: {started:%Y-%m-%d %H:%M} UTC; machine: {facts['nproc']} "
        f"cores (nproc), {facts['RAM']} RAM, {facts['CPU']}; Kafka: {broker_description}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
