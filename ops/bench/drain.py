"""(b) Drain throughput: one ``pipeline-worker --burst`` next to a raw confluent-kafka consumer."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from confluent_kafka import Consumer

from pipeline import Pipeline, Settings
from pipeline._codec import JobCodec

from .app import EXPECTED_ENV, RECORD_ENV
from .env import fresh_namespace, say, start_worker, tail, worker_command_line
from .report import Measurement, Section, goal_line

if TYPE_CHECKING:
    from pathlib import Path

JOB_TYPE = "bench.noop"


def _fill(settings: Settings, jobs: int) -> None:
    with Pipeline(settings) as app:
        for start in range(0, jobs, 50_000):
            app.enqueue_many(JOB_TYPE, ({"n": i} for i in range(start, min(jobs, start + 50_000))))
            app.flush(120)


def _raw_consume(settings: Settings, topic: str, jobs: int, *, decode: bool) -> tuple[float, float]:
    """Consume ``jobs`` messages in a new group; return (wall seconds, first-to-last seconds)."""
    consumer = Consumer(
        {
            **settings.client_config(),
            "group.id": f"{settings.namespace}.raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
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
    consumer.commit(asynchronous=False)
    consumer.close()
    return time.perf_counter() - began, last - first


def _worker_drain(
    settings: Settings, jobs: int, args: list[str], workdir: Path
) -> tuple[float, float]:
    """Run ``pipeline-worker --burst``; return (start-to-exit, first-to-last job) seconds."""
    record, log = workdir / "drain.record", workdir / "drain-worker.log"
    record.unlink(missing_ok=True)
    began = time.time_ns()
    process = start_worker(settings, args, {RECORD_ENV: str(record), EXPECTED_ENV: str(jobs)}, log)
    code = process.wait(900)
    ended = time.time_ns()
    if code != 0:
        raise RuntimeError(f"pipeline-worker --burst exited with {code}:\n{tail(log)}")
    marks = dict(line.split() for line in record.read_text().splitlines())
    if "first" not in marks or "last" not in marks:
        raise RuntimeError(f"the worker did not run all {jobs} jobs (marks {marks}):\n{tail(log)}")
    return (ended - began) / 1e9, (int(marks["last"]) - int(marks["first"])) / 1e9


def _median_run(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """The run with the median first-to-last time: (wall, first-to-last) of one real run."""
    return sorted(runs, key=lambda run: run[1])[len(runs) // 2]


def run(bootstrap_servers: str, jobs: int, workdir: Path, repeats: int = 3) -> Section:
    settings = fresh_namespace(bootstrap_servers, "drain")
    topic = f"{settings.namespace}.jobs.default"
    say(f"drain: filling {topic} with {jobs:,} no-op jobs")
    _fill(settings, jobs)

    # Each run reads the same messages in a group of its own; the machine is noisy, so every
    # reading is taken `repeats` times, interleaved, and the median run is reported.
    raws, decodes, workers = [], [], []
    args = ["--burst", "--priorities", "default"]
    for attempt in range(1, repeats + 1):
        say(f"drain: run {attempt}/{repeats}: raw consume loop")
        raws.append(_raw_consume(settings, topic, jobs, decode=False))
        say(f"drain: run {attempt}/{repeats}: raw consume loop + decoding every job")
        decodes.append(_raw_consume(settings, topic, jobs, decode=True))
        say(f"drain: run {attempt}/{repeats}: {worker_command_line(args)}")
        group = ["--group", f"{settings.namespace}.workers-{attempt}"]
        workers.append(_worker_drain(settings, jobs, [*args, *group], workdir))
    raw_wall, raw_span = _median_run(raws)
    decode_wall, decode_span = _median_run(decodes)
    worker_wall, worker_span = _median_run(workers)
    worker_rates = sorted(jobs / span for _wall, span in workers)

    raw_command = "Consumer.subscribe(); consume(1000) until all seen; commit()"
    raw_span_m = Measurement("raw consume loop, first to last message", jobs, raw_span, raw_command)
    raw_wall_m = Measurement("raw consume loop, subscribe to commit", jobs, raw_wall, raw_command)
    worker_command = worker_command_line(args)
    worker_span_m = Measurement(
        "pipeline-worker, first to last job", jobs, worker_span, worker_command
    )
    worker_wall_m = Measurement(
        "pipeline-worker, process start to exit", jobs, worker_wall, worker_command
    )
    span_ratio = worker_span_m.rate / raw_span_m.rate
    return Section(
        "(b) Drain throughput",
        f"{jobs:,} pre-filled no-op jobs in one topic of 6 partitions, drained by one worker "
        "process (default settings: `--concurrency 64`, plain-function handler on the thread "
        "pool, commits batched), next to a raw confluent-kafka consumer reading the same "
        'messages in its own group, in the same run. "First to last" is the time between '
        "the first and the last handler call (from the handler's own timestamps) or message; "
        '"start to exit" includes the interpreter start, imports, joining the group, the '
        "final commit and leaving the group. Every reading was taken "
        f"{repeats} time(s), interleaved, each in a new consumer group; the table shows the "
        "run with the median first-to-last time.",
        rows=[
            (raw_span_m, None),
            (
                Measurement(
                    "raw consume loop + JobCodec.decode",
                    jobs,
                    decode_span,
                    raw_command + " + decode",
                ),
                raw_span_m,
            ),
            (worker_span_m, raw_span_m),
            (raw_wall_m, None),
            (worker_wall_m, raw_wall_m),
        ],
        extra=[
            f"Raw consume loop + decode, subscribe to commit: {decode_wall:.3f} s. "
            f"pipeline-worker, first to last job, every run: "
            f"{', '.join(f'{rate:,.0f}' for rate in worker_rates)} jobs/s.",
            "",
            f"The raw loop never touches a message in Python. Decoding each job's envelope "
            f"(Avro) and payload (JSON), and nothing else, already brings it to "
            f"{jobs / decode_span / raw_span_m.rate:.0%} of its rate: a Python worker that reads "
            "its jobs cannot reach 50% of it. The worker's rate next to the decoding loop's: "
            f"{worker_span_m.rate * decode_span / jobs:.0%}.",
        ],
        goal=goal_line(
            [
                (f"≥ 50,000 jobs/s ({worker_span_m.rate:,.0f})", worker_span_m.rate >= 50_000),
                (f"≥ 50% of raw ({span_ratio:.0%})", span_ratio >= 0.5),
            ]
        ),
    )
