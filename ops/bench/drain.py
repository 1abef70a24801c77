"""(b) Drain throughput: ``pipeline-worker --burst``, now and at a baseline commit, next to a raw
confluent-kafka consumer, all in one run on one broker.

``python -m ops.bench.drain [--jobs N] [--repeats N] [--baseline-ref REF | --no-baseline]``
runs this section alone (a broker is started unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set) and
prints it, with the command, the date and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer

from pipeline import Pipeline, Settings
from pipeline._codec import JobCodec

from .app import EXPECTED_ENV, RECORD_ENV
from .baseline import DEFAULT_REF, Baseline, BaselineError, baseline_tree
from .env import (
    HOOK_OUT_ENV,
    Broker,
    broker,
    footer,
    fresh_namespace,
    say,
    start_worker,
    tail,
    worker_command_line,
)
from .report import Measurement, Section, goal_line

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

JOB_TYPE = "bench.noop"
ARGS = ["--burst", "--priorities", "default"]
Run = tuple[float, float]
"""(wall seconds, first-to-last seconds) of one drain."""


def _fill(settings: Settings, jobs: int, job_type: str = JOB_TYPE) -> None:
    with Pipeline(settings) as app:
        for start in range(0, jobs, 50_000):
            app.enqueue_many(job_type, ({"n": i} for i in range(start, min(jobs, start + 50_000))))
            app.flush(120)


@contextlib.contextmanager
def filled(label: str, jobs: int) -> Iterator[tuple[Broker, Settings, Path]]:
    """A broker (see :func:`.env.broker`), a new namespace ``label`` whose ``jobs.default`` holds
    ``jobs`` no-op jobs, and a temporary directory: what a benchmark of drains starts from."""
    with broker() as kafka, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        settings = fresh_namespace(kafka.bootstrap_servers, label)
        say(f"{label}: filling {settings.namespace}.jobs.default with {jobs:,} no-op jobs")
        _fill(settings, jobs)
        yield kafka, settings, Path(tmp)


def raw_consume(
    settings: Settings,
    topic: str,
    jobs: int,
    *,
    decode: bool,
    conf: Mapping[str, Any] | None = None,
    settle_s: float = 0.0,
) -> Run:
    """Consume ``jobs`` messages in a new group; return (wall seconds, first-to-last seconds).

    ``conf``: more consumer options (callbacks included); ``settle_s``: keep polling this long
    after the last message, for the callbacks still due (not counted in either time)."""
    consumer = Consumer(
        {
            **settings.client_config(),
            "group.id": f"{settings.namespace}.raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **(conf or {}),
        }
    )
    codec = JobCodec()
    began = time.perf_counter()
    consumer.subscribe([topic])
    seen = 0
    first = last = 0.0
    while seen < jobs:
        for message in consumer.consume(1000, timeout=1.0):
            if message.error() is not None:
                continue
            if decode:
                codec.decode(message.value() or b"")
            seen += 1
            if seen == 1:
                first = time.perf_counter()
        if time.perf_counter() - began > 600:
            raise RuntimeError(f"raw consumer saw only {seen} of {jobs} messages in 600 s")
    last = time.perf_counter()
    while time.perf_counter() < last + settle_s:
        consumer.poll(0.1)
    settled = time.perf_counter() - last
    consumer.commit(asynchronous=False)
    consumer.close()
    return time.perf_counter() - began - settled, last - first


def worker_drain(
    settings: Settings,
    jobs: int,
    args: list[str],
    workdir: Path,
    env: Mapping[str, str],
    *,
    hook: str | None = None,
) -> Run:
    """Run ``pipeline-worker --burst`` (through ``hook``, see :func:`.env.start_worker`);
    return (start-to-exit, first-to-last job) seconds."""
    record, log = workdir / "drain.record", workdir / "drain-worker.log"
    record.unlink(missing_ok=True)
    began = time.time_ns()
    environ = {RECORD_ENV: str(record), EXPECTED_ENV: str(jobs), **env}
    process = start_worker(settings, args, environ, log, hook=hook)
    code = process.wait(900)
    ended = time.time_ns()
    if code != 0:
        raise RuntimeError(f"pipeline-worker --burst exited with {code}:\n{tail(log)}")
    marks = dict(line.split() for line in record.read_text().splitlines())
    if "first" not in marks or "last" not in marks:
        raise RuntimeError(f"the worker did not run all {jobs} jobs (marks {marks}):\n{tail(log)}")
    return (ended - began) / 1e9, (int(marks["last"]) - int(marks["first"])) / 1e9


def hooked_drain(
    settings: Settings,
    jobs: int,
    hook: str,
    args: list[str],
    *,
    env: Mapping[str, str],
    work: Path,
) -> tuple[float, str]:
    """Drain ``jobs`` pre-filled no-op jobs with the worker run through ``hook`` (see
    :func:`.env.start_worker`); return (first-to-last jobs/s, what the hook wrote to
    ``$BENCH_HOOK_OUT``)."""
    out = work / "hook-out"
    out.unlink(missing_ok=True)
    _wall, span = worker_drain(
        settings, jobs, args, work, {HOOK_OUT_ENV: str(out), **env}, hook=hook
    )
    if not out.exists():
        raise RuntimeError(f"the worker run through {hook} wrote nothing to {HOOK_OUT_ENV}")
    return jobs / span, out.read_text()


def median_run(runs: list[Run]) -> Run:
    """The run with the median first-to-last time: (wall, first-to-last) of one real run."""
    return sorted(runs, key=lambda run: run[1])[len(runs) // 2]


def rates(jobs: int, runs: list[Run]) -> str:
    return ", ".join(f"{rate:,.0f}" for rate in sorted(jobs / span for _wall, span in runs))


@dataclass
class _Runs:
    """Every drain of one section, by reader."""

    raw: list[Run] = field(default_factory=list)
    decode: list[Run] = field(default_factory=list)
    before: list[Run] = field(default_factory=list)
    now: list[Run] = field(default_factory=list)


def _drain_all(
    settings: Settings, jobs: int, workdir: Path, repeats: int, baseline: Baseline | None
) -> _Runs:
    # Each run reads the same messages in a group of its own; the machine is noisy, so every
    # reading is taken `repeats` times, interleaved, and the median run is reported. The two
    # workers take turns going first, so neither always runs on a warmer broker.
    topic = f"{settings.namespace}.jobs.default"
    runs = _Runs()
    command = worker_command_line(ARGS)
    for attempt in range(1, repeats + 1):
        say(f"drain: run {attempt}/{repeats}: raw consume loop")
        runs.raw.append(raw_consume(settings, topic, jobs, decode=False))
        say(f"drain: run {attempt}/{repeats}: raw consume loop + decoding every job")
        runs.decode.append(raw_consume(settings, topic, jobs, decode=True))
        workers: list[tuple[str, list[Run], Mapping[str, str]]] = [("now", runs.now, {})]
        if baseline is not None:
            workers.insert(attempt % 2, ("before", runs.before, baseline.environ()))
        for name, into, env in workers:
            say(f"drain: run {attempt}/{repeats}: {command} ({name})")
            group = ["--group", f"{settings.namespace}.workers-{name}-{attempt}"]
            into.append(worker_drain(settings, jobs, [*ARGS, *group], workdir, env))
    return runs


def run(
    bootstrap_servers: str,
    jobs: int,
    workdir: Path,
    repeats: int = 3,
    baseline: Baseline | None = None,
) -> Section:
    """Fill a topic, then drain it ``repeats`` times with each reader, interleaved: the raw loop,
    the raw loop decoding, the worker of ``baseline`` (when given) and the current worker."""
    settings = fresh_namespace(bootstrap_servers, "drain")
    say(f"drain: filling {settings.namespace}.jobs.default with {jobs:,} no-op jobs")
    _fill(settings, jobs)
    return _section(jobs, repeats, _drain_all(settings, jobs, workdir, repeats, baseline), baseline)


def _section(jobs: int, repeats: int, runs: _Runs, baseline: Baseline | None) -> Section:
    raw_wall, raw_span = median_run(runs.raw)
    decode_wall, decode_span = median_run(runs.decode)
    command = worker_command_line(ARGS)
    raw_command = "Consumer.subscribe(); consume(1000) until all seen; commit()"
    raw_span_m = Measurement("raw consume loop, first to last message", jobs, raw_span, raw_command)
    raw_wall_m = Measurement("raw consume loop, subscribe to commit", jobs, raw_wall, raw_command)
    decode_m = Measurement(
        "raw consume loop + JobCodec.decode, first to last message",
        jobs,
        decode_span,
        raw_command + " + decode",
    )
    now_label = "pipeline-worker (now)" if baseline is not None else "pipeline-worker"
    now_wall, now_span = median_run(runs.now)
    now_m = Measurement(f"{now_label}, first to last job", jobs, now_span, command)
    span_rows: list[tuple[Measurement, Measurement | None]] = [
        (raw_span_m, None),
        (decode_m, raw_span_m),
    ]
    wall_rows: list[tuple[Measurement, Measurement | None]] = [(raw_wall_m, None)]
    extra = [f"Raw consume loop + decode, subscribe to commit: {decode_wall:.3f} s."]
    share = now_m.rate / decode_m.rate
    checks = [(f"≥ 50% of the decoding loop ({share:.0%})", share >= 0.5)]
    readers = "the raw loop, the raw loop decoding every job"
    if baseline is not None:
        before_wall, before_span = median_run(runs.before)
        before_label = f"pipeline-worker at {baseline.ref} (before)"
        before_m = Measurement(f"{before_label}, first to last job", jobs, before_span, command)
        span_rows.append((before_m, decode_m))
        before_wall_m = Measurement(
            f"{before_label}, process start to exit", jobs, before_wall, command
        )
        wall_rows.append((before_wall_m, raw_wall_m))
        extra.append(
            f"{before_label}, first to last job, every run: {rates(jobs, runs.before)} jobs/s."
        )
        speedup = now_m.rate / before_m.rate
        checks.append((f"faster than before ({speedup:.2f}x)", speedup > 1.0))
        readers += (
            f", the worker of commit {baseline.ref} ({baseline.commit[:12]}: its `libs` and "
            "`services` run from a `git archive` of it, in the same environment, with the same "
            "bench app) and the current worker"
        )
    else:
        readers += " and the worker"
    span_rows.append((now_m, decode_m))
    now_wall_m = Measurement(f"{now_label}, process start to exit", jobs, now_wall, command)
    wall_rows.append((now_wall_m, raw_wall_m))
    extra.append(f"{now_label}, first to last job, every run: {rates(jobs, runs.now)} jobs/s.")
    return Section(
        "(b) Drain throughput",
        f"{jobs:,} pre-filled no-op jobs in one topic of 6 partitions, drained by one worker "
        "process (default settings: `--concurrency 64`, plain-function handler on the thread "
        "pool, commits batched), next to a raw confluent-kafka consumer reading the same "
        f"messages in its own group, on the same broker in the same run. Readers: {readers}. "
        '"First to last" is the time between the first and the last handler call (from the '
        'handler\'s own timestamps) or message; "start to exit" includes the interpreter '
        "start, imports, joining the group, the final commit and leaving the group. Every "
        f"reading was taken {repeats} time(s), interleaved, each in a new consumer group; the "
        'table shows the run with the median first-to-last time. "vs raw": the decoding loop '
        "against the raw loop, each worker's first-to-last rate against the decoding loop's (a "
        "Python worker must decode every job: that loop is its ceiling), start-to-exit rows "
        "against the raw loop's subscribe-to-commit.",
        rows=span_rows + wall_rows,
        extra=extra,
        goal=goal_line(checks),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.drain",
        description="Drain throughput of pipeline-worker, now and at a baseline commit, next to "
        "a raw confluent-kafka consumer (prints Markdown).",
    )
    parser.add_argument("--jobs", type=int, default=200_000, help="jobs to drain (200,000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each reader (3)")
    add_baseline_options(parser)
    return parser


def add_baseline_options(parser: argparse.ArgumentParser) -> None:
    """``--baseline-ref REF`` and ``--no-baseline`` (shared with ``python -m ops.bench``)."""
    parser.add_argument(
        "--baseline-ref",
        help=f"also drain with the worker of this commit (default {DEFAULT_REF}, the worker "
        "before its stage packages)",
    )
    parser.add_argument(
        "--no-baseline", action="store_true", help="drain with the current worker only"
    )


def baseline_context(
    ref: str | None, *, skip: bool
) -> contextlib.AbstractContextManager[Baseline | None]:
    """The baseline tree to drain with, or none (``skip``)."""
    if skip:
        return contextlib.nullcontext()
    return baseline_tree(ref or DEFAULT_REF)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.no_baseline and args.baseline_ref:
        raise SystemExit("--baseline-ref and --no-baseline contradict each other: pass one")
    command = " ".join(["python -m ops.bench.drain", *(argv if argv is not None else sys.argv[1:])])
    started = datetime.now(UTC)
    with (
        baseline_context(args.baseline_ref, skip=args.no_baseline) as baseline,
        broker() as kafka,
        tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp,
    ):
        section = run(kafka.bootstrap_servers, args.jobs, Path(tmp), args.repeats, baseline)
        broker_description = kafka.description
    section.extra += [
        "",
        footer(command, broker_description, started),
    ]
    print(section.markdown())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BaselineError as exc:  # says what to do: no traceback
        sys.exit(f"python -m ops.bench.drain: {exc}")
