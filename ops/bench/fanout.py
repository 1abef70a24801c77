"""A job that fans out: one running job's ``enqueue_many`` of many payloads, old code against new.

``python -m ops.bench.fanout [--jobs N] [--repeats N] [--rounds N] [--baseline-ref REF]
[--output FILE]`` runs, interleaved, ``--repeats`` processes of the current code and as many of
the code of ``REF`` (``git archive`` of it first on ``PYTHONPATH``), each against the same broker.
Each process marks a job as running in its context, as the worker does, and times ``--rounds``
times (after one round to warm up): ``app.enqueue_many`` of ``N`` payloads in that job (its
follow-ups, handed to the producer), then until Kafka acknowledged every one of them (when the
worker could end the job). A broker is started unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set; the
section goes to docs/benchmarks.md (or ``--output``) and is printed.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .baseline import baseline_tree
from .env import REPO_ROOT, broker, footer, fresh_namespace, say
from .report import Section, add_output_option, without_output, write_sections

if TYPE_CHECKING:
    from pipeline import Pipeline

TITLE = "A job that enqueues many jobs"
DEFAULT_REF = "dc5b80c"
"""The last commit whose running jobs handed their ``enqueue_many`` follow-ups over one a call."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.fanout", description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000, help="payloads per call (10,000)")
    parser.add_argument("--repeats", type=int, default=5, help="processes of each code (5)")
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per process (5)")
    parser.add_argument(
        "--baseline-ref", default=DEFAULT_REF, help=f"the code before (default {DEFAULT_REF})"
    )
    add_output_option(parser)
    return parser


@dataclass
class _Job:
    """A job the worker runs, as an enqueue in its context sees it."""

    finished: bool = False
    follow_ups: Any = None


def _round(app: Pipeline, jobs: int) -> tuple[float, float]:
    """One running job's ``enqueue_many`` of ``jobs`` payloads: seconds until it returned, and
    until Kafka acknowledged them all."""
    from pipeline._followups import RUNNING

    job = _Job()

    def fan_out() -> tuple[float, float]:
        RUNNING.set(job)
        started = time.perf_counter()
        ids = app.enqueue_many("bench.noop", ({"n": n} for n in range(jobs)))
        handed = time.perf_counter()
        if len(ids) != jobs or not job.follow_ups.answered_by_now():
            raise RuntimeError("Kafka did not acknowledge the follow-ups")
        return handed - started, time.perf_counter() - started

    return contextvars.copy_context().run(fan_out)


def child(jobs: int, rounds: int) -> None:
    """In a process of its own (its code on ``PYTHONPATH``): one round to warm up, then
    ``rounds`` timed ones, printed as JSON with the file ``pipeline`` was imported from."""
    import pipeline
    from pipeline import Pipeline

    app = Pipeline()  # broker and namespace from the environment
    _round(app, jobs)
    timed = [_round(app, jobs) for _ in range(rounds)]
    app.close()
    print(json.dumps({"module": pipeline.__file__, "rounds": timed}))


def _run(env: dict[str, str], jobs: int, rounds: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "ops.bench.fanout", "child", str(jobs), str(rounds)]
    done = subprocess.run(
        command, env={**os.environ, **env}, cwd=REPO_ROOT, capture_output=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["child"]:
        child(int(given[1]), int(given[2]))
        return 0
    args = _parser().parse_args(given)
    command = " ".join(["python -m ops.bench.fanout", *without_output(given)])
    started = datetime.now(UTC)
    rounds: dict[str, list[tuple[float, float]]] = {"before": [], "now": []}
    now_path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    with baseline_tree(args.baseline_ref) as baseline, broker() as kafka:
        settings = fresh_namespace(kafka.bootstrap_servers, "fanout")
        place = {
            "PIPELINE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
            "PIPELINE_NAMESPACE": settings.namespace,
        }
        codes = [("before", baseline.environ()), ("now", {"PYTHONPATH": now_path})]
        for attempt in range(args.repeats):
            for name, env in codes[attempt % 2 :] + codes[: attempt % 2]:
                say(f"fanout: process {attempt + 1}/{args.repeats}: {name}")
                result = _run({**place, **env}, args.jobs, args.rounds)
                say(f"fanout: {name} imported {result['module']}: {result['rounds']}")
                if name == "before" and not result["module"].startswith(str(baseline.root)):
                    raise RuntimeError(f"the baseline imported {result['module']}")
                rounds[name] += [(r[0], r[1]) for r in result["rounds"]]
        described = kafka.description
    result_section = _section(
        args, baseline.ref, rounds=rounds, command=command, described=described, started=started
    )
    write_sections(args.output, [result_section])
    print(result_section.markdown())
    return 0


def _section(
    args: argparse.Namespace,
    ref: str,
    *,
    rounds: dict[str, list[tuple[float, float]]],
    command: str,
    described: str,
    started: datetime,
) -> Section:
    jobs = args.jobs
    median = {
        name: (statistics.median(r[0] for r in every), statistics.median(r[1] for r in every))
        for name, every in rounds.items()
    }
    labels = {
        "before": f"at {ref}: one `produce_many` call per job",
        "now": "now: one `produce_many` call per 1,000 jobs",
    }
    lines = [
        "| code | `enqueue_many` returned (median s) | jobs/s | all acknowledged (median s) "
        "| jobs/s | every hand-over (s) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, label in labels.items():
        handed, acked = median[name]
        every = ", ".join(f"{r[0]:.3f}" for r in sorted(rounds[name]))
        lines.append(
            f"| {label} | {handed:.3f} | {jobs / handed:,.0f} | {acked:.3f} | "
            f"{jobs / acked:,.0f} | {every} |"
        )
    speed_up = median["before"][0] / median["now"][0]
    to_acked = median["before"][1] / median["now"][1]
    lines += [
        "",
        f"Now against before, at the median: the hand-over takes {1 / speed_up:.2f} times as "
        f"long ({speed_up:.1f} times as fast), the job's follow-ups all acknowledged "
        f"{1 / to_acked:.2f} times as long.",
        "",
        footer(command, described, started),
    ]
    description = (
        f"A running job (marked in its context as the worker marks one) calls "
        f"`app.enqueue_many` with {jobs:,} payloads, with the application's default producer "
        "settings, into a topic no worker reads; timed until the call returned (the jobs "
        "handed to the producer, each counted as a follow-up of the job), and until Kafka "
        "acknowledged all of them (when the worker may end the job). "
        f"{args.repeats} processes of each code, interleaved, {args.rounds} timed calls each "
        "after one to warm up; the code before is the same tree at the commit before "
        "(`git archive`, first on `PYTHONPATH`), on the same broker."
    )
    return Section(TITLE, description, extra=lines)


if __name__ == "__main__":
    sys.exit(main())
