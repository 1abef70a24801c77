"""Jobs that enqueue a job: what waiting for Kafka's acknowledgement of the follow-up costs.

``python -m ops.bench.followups [--jobs N] [--repeats N] [--baseline-ref REF] [--output FILE]``
fills one namespace with ``bench.forward`` jobs (each enqueues a ``bench.noop`` follow-up into a
second namespace that no worker reads) and another with ``bench.noop`` jobs, then drains them
with ``pipeline-worker --burst``, interleaved, each drain in a consumer group of its own: the
no-op jobs and the forwarding jobs with the current worker, and the forwarding jobs with the
worker of ``REF`` (whose jobs ended at their handler's return, before Kafka acknowledged their
follow-ups). A broker is started unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set; the section goes
to docs/benchmarks.md (or ``--output``) and is printed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from .app import SINK_ENV
from .baseline import baseline_tree
from .drain import ARGS, Run, _fill, median_run, rates, worker_drain
from .env import broker, footer, fresh_namespace, say, worker_command_line
from .report import Section, add_output_option, without_output, write_sections

TITLE = "Jobs that enqueue a job"
DEFAULT_REF = "5c7d0dc"
"""The last commit whose jobs ended before Kafka acknowledged what their handler enqueued."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.followups", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs per drain (100,000)")
    parser.add_argument("--repeats", type=int, default=3, help="drains of each kind (3)")
    parser.add_argument(
        "--baseline-ref", default=DEFAULT_REF, help=f"the worker before (default {DEFAULT_REF})"
    )
    add_output_option(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(given)
    command = " ".join(["python -m ops.bench.followups", *without_output(given)])
    started = datetime.now(UTC)
    jobs = args.jobs
    runs: dict[str, list[Run]] = {"noop": [], "before": [], "now": []}
    with (
        baseline_tree(args.baseline_ref) as baseline,
        broker() as kafka,
        tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp,
    ):
        plain = fresh_namespace(kafka.bootstrap_servers, "noop")
        forwarding = fresh_namespace(kafka.bootstrap_servers, "forward")
        sink = fresh_namespace(kafka.bootstrap_servers, "sink")
        say(f"followups: filling {jobs:,} no-op and {jobs:,} forwarding jobs")
        _fill(plain, jobs)
        _fill(forwarding, jobs, "bench.forward")
        drains = [
            ("noop", plain, {}),
            ("before", forwarding, {SINK_ENV: sink.namespace, **baseline.environ()}),
            ("now", forwarding, {SINK_ENV: sink.namespace}),
        ]
        for attempt in range(args.repeats):
            shift = attempt % len(drains)
            for name, settings, env in drains[shift:] + drains[:shift]:
                say(f"followups: run {attempt + 1}/{args.repeats}: {name}")
                group = ["--group", f"{settings.namespace}.workers-{name}-{attempt}"]
                runs[name].append(worker_drain(settings, jobs, [*ARGS, *group], Path(tmp), env))
        described = kafka.description
    rate = {name: jobs / median_run(every)[1] for name, every in runs.items()}
    lines = [
        "| worker, jobs | median jobs/s (first to last job) | vs no-op jobs | every run |",
        "|---|---:|---:|---|",
    ]
    labels = {
        "noop": "now, `bench.noop` (enqueues nothing)",
        "before": f"at {baseline.ref}, `bench.forward` (ends at its return)",
        "now": "now, `bench.forward` (ends once Kafka acknowledged its follow-up)",
    }
    for name, label in labels.items():
        share = rate[name] / rate["noop"]
        lines.append(f"| {label} | {rate[name]:,.0f} | {share:.0%} | {rates(jobs, runs[name])} |")
    lines += [
        "",
        f"The forwarding jobs now against before: {rate['now'] / rate['before']:.2f} times the "
        "rate at the median.",
        "",
        footer(command, described, started),
    ]
    description = (
        f"{jobs:,} pre-filled jobs in one topic of 6 partitions, drained by "
        f"`{worker_command_line(ARGS)}` (default settings, plain-function handlers on the thread "
        "pool), each drain in a consumer group of its own, the kinds interleaved "
        f"({args.repeats} drains of each). `bench.forward` enqueues one `bench.noop` job into "
        "a namespace no worker reads, with the application's default producer settings, then "
        "returns; `bench.noop` does nothing. The worker of the commit before ended a job at "
        "its handler's return, and committed its offset while Kafka might not yet have "
        "acknowledged the follow-up; the current one ends it once Kafka did "
        '(docs/worker.md, "Jobs a handler enqueues end with it").'
    )
    result = Section(TITLE, description, extra=lines)
    write_sections(args.output, [result])
    print(result.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
