"""``python -m ops.bench [--quick] [--only SECTION]... [--latency-rate N] [--output PATH]
[--baseline-ref REF | --no-baseline]``.

The drain section also drains with the worker of a baseline commit (:mod:`.baseline`), except in
a ``--quick`` run unless ``--baseline-ref`` names one."""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from . import drain, enqueue, latency, processes, scheduler
from .baseline import BaselineError
from .env import REPO_ROOT, broker, machine, say
from .report import Section, document

SECTIONS = ("enqueue", "drain", "latency", "scheduler", "processes")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench",
        description="Measure enqueue and drain throughput and enqueue-to-start latency next to "
        "raw confluent-kafka, and write the results (Markdown).",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small counts: a smoke run, not a measurement"
    )
    parser.add_argument(
        "--only", choices=SECTIONS, action="append", help="run this section (repeatable)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        help="runs of each enqueue and drain reading (default 3; 1 with --quick)",
    )
    parser.add_argument(
        "--latency-rate",
        type=float,
        help="jobs per second of the latency section (default 2000; 500 with --quick)",
    )
    drain.add_baseline_options(parser)
    parser.add_argument(
        "--output",
        type=Path,
        default=REPO_ROOT / "docs" / "benchmarks.md",
        help="where to write the results (default: docs/benchmarks.md)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.no_baseline and args.baseline_ref:
        raise SystemExit("--baseline-ref and --no-baseline contradict each other: pass one")
    quick = args.quick
    wanted = args.only or list(SECTIONS)
    command = " ".join(["python -m ops.bench", *(argv if argv is not None else sys.argv[1:])])
    if args.output.resolve() != (REPO_ROOT / "docs" / "benchmarks.md").resolve():
        # Only the path the reader would type matters; keep machine paths out of the report.
        command = command.replace(str(args.output), args.output.name)
    started = datetime.now(UTC)
    sections: list[Section] = []
    # A smoke run skips the baseline unless asked for one; a missing commit fails before the
    # broker starts.
    skip_baseline = args.no_baseline or (quick and not args.baseline_ref) or "drain" not in wanted
    with (
        drain.baseline_context(args.baseline_ref, skip=skip_baseline) as baseline,
        broker() as kafka,
        tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp,
    ):
        workdir = Path(tmp)
        say(f"bench: Kafka at {kafka.bootstrap_servers}")
        if "enqueue" in wanted:
            jobs, repeats = (10_000, 1) if quick else (100_000, 3)
            repeats = args.repeats or repeats
            sections.append(enqueue.run(kafka.bootstrap_servers, jobs, repeats))
        if "drain" in wanted:
            jobs, repeats = (10_000, 1) if quick else (200_000, 3)
            repeats = args.repeats or repeats
            sections.append(drain.run(kafka.bootstrap_servers, jobs, workdir, repeats, baseline))
        if "latency" in wanted:
            rate, seconds = (500.0, 1.0) if quick else (2000.0, 10.0)
            rate = args.latency_rate or rate
            warm_up_s = 0.5 if quick else latency.BROKER_WARM_UP_S
            sections.append(latency.run(kafka.bootstrap_servers, rate, seconds, workdir, warm_up_s))
        if "scheduler" in wanted:
            sections.append(scheduler.run(kafka.bootstrap_servers, quick, workdir))
        if "processes" in wanted:
            sections.append(processes.run(kafka.bootstrap_servers, quick, workdir))
        broker_description = kafka.description
    facts = machine()
    header = [
        "# Benchmarks",
        "",
        "Written by `python -m ops.bench` (`make bench`). Every number in the sections it "
        "writes comes from the one run described here (sections added after them name their "
        "own commands); each pipeline number is set next to a raw confluent-kafka "
        "baseline measured in the same run, on the same broker and machine. Quick runs "
        "(`--quick`) are smoke tests, not measurements.",
        "",
        f"- Command: `{command}`",
        f"- Date: {started:%Y-%m-%d %H:%M} UTC",
        f"- Machine: {facts['nproc']} cores (nproc), {facts['RAM']} RAM, {facts['CPU']}, "
        f"{facts['OS']}",
        f"- Python {facts['Python']}, confluent-kafka {facts['confluent-kafka']} "
        f"(librdkafka {facts['librdkafka']})",
        f"- Kafka: {broker_description}",
        "- The producer, the broker and the worker share the machine's cores.",
    ]
    existing = args.output.read_text() if args.output.is_file() else ""
    text = document(header, sections, existing)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    say(f"bench: results written to {args.output}")
    print(text)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BaselineError as exc:  # says what to do: no traceback
        sys.exit(f"python -m ops.bench: {exc}")
