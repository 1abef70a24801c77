"""(c) Enqueue-to-start latency at a fixed rate, next to a raw produce-consume round trip.

The pipeline side: one process enqueues jobs with ``app.enqueue``, each carrying
``time.time_ns()``; a ``pipeline-worker`` runs them and its handler writes how long ago that
was. The raw side: a plain confluent-kafka producer with the same settings sends the timestamp
itself, and a plain consumer in its own process (``ops.bench.rawlatency``) writes how long ago
it was when the message arrived: the floor Kafka and librdkafka set on this machine. Both run
with the producer's default ``linger.ms`` (0) and with the old default, 5 ms: the linger is part
of the latency.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from confluent_kafka import Producer

from pipeline import Pipeline, Priority, Settings
from pipeline._producer import producer_config
from pipeline._topics import TopicNames

from .app import RECORD_ENV
from .enqueue import OLD_LINGER_MS
from .env import REPO_ROOT, fresh_namespace, say, start_worker, stop, tail, worker_command_line
from .report import Section, goal_line, percentile

if TYPE_CHECKING:
    from pathlib import Path

JOB_TYPE = "bench.latency"
WARM_UP = 200
"""Messages sent at once first, to see the receiver run (not counted)."""
STEADY_AFTER_S = 1.0
"""Then this long at the measured rate, not counted either: the numbers are the steady state
(the broker's first second at a new request rate is slower, for raw clients too)."""
BROKER_WARM_UP_S = 10.0
"""Before the first pair, the raw pair runs this long at the rate, not counted: a broker that
has just started has not compiled its request paths yet (its JVM's JIT), and the first pair
measured on it took up to twice as long as the same pair a minute later, for raw clients as
for the pipeline. A broker in service is warm; so are the numbers."""
WORKER_ARGS = ["--priorities", "default"]


@dataclass(frozen=True)
class Run:
    label: str
    linger_ms: float
    latencies_ms: list[float]
    """Sorted."""
    offered: float
    """Jobs per second actually offered."""


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


def _paced(send: Callable[[int], object], rate: float, total: int) -> float:
    """Call ``send(i)`` for ``i`` in ``range(total)`` at ``rate`` per second; return the time."""
    began = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - began) * rate) + 1)
        while sent < due:
            send(sent)
            sent += 1
        time.sleep(0.0005)  # pacing between sends, not waiting for a condition
    return time.perf_counter() - began


def _sorted_ms(lines: list[str], skip: int) -> list[float]:
    return sorted(int(line) / 1e6 for line in lines[skip:])


def _pipeline(settings: Settings, rate: float, total: int, workdir: Path) -> tuple[Run, int]:
    """Enqueue to a ``pipeline-worker``; return the run and the worker's exit code."""
    linger = settings.producer.linger_ms
    record = workdir / f"latency-{linger:g}.record"
    log = workdir / f"latency-{linger:g}-worker.log"
    process = start_worker(settings, WORKER_ARGS, {RECORD_ENV: str(record)}, log)
    try:
        with Pipeline(settings) as app:
            # Warm up until the worker owns the partitions and runs jobs; not measured.
            for i in range(WARM_UP):
                app.enqueue(JOB_TYPE, {"n": -i, "t": time.time_ns()})
            app.flush(60)
            _wait_lines(record, WARM_UP, 120, log)
            say(f"latency: {total:,} jobs at {rate:g} jobs/s, linger.ms={linger:g}")
            steady = int(rate * STEADY_AFTER_S)
            _paced(lambda n: app.enqueue(JOB_TYPE, {"n": -n, "t": time.time_ns()}), rate, steady)
            took = _paced(
                lambda n: app.enqueue(JOB_TYPE, {"n": n, "t": time.time_ns()}), rate, total
            )
            app.flush(60)
        lines = _wait_lines(record, WARM_UP + steady + total, 120, log)
    finally:
        code = stop(process)
    return Run(
        "pipeline `app.enqueue` → `pipeline-worker` handler",
        linger,
        _sorted_ms(lines, WARM_UP + steady),
        total / took,
    ), code


def _raw(settings: Settings, rate: float, total: int, workdir: Path, name: str = "raw") -> Run:
    """A plain producer and a plain consumer process, on an empty topic of the namespace."""
    linger = settings.producer.linger_ms
    topic = TopicNames(settings.namespace).jobs(Priority.LOW)  # as many partitions, unused
    record = workdir / f"{name}-{linger:g}.record"
    log = workdir / f"{name}-{linger:g}.log"
    with log.open("wb") as out:
        consumer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ops.bench.rawlatency",
                settings.bootstrap_servers,
                topic,
                str(record),
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    producer = Producer(producer_config(settings))
    try:
        for _ in range(WARM_UP):
            producer.produce(topic, str(time.time_ns()).encode())
        producer.flush(60)
        _wait_lines(record, WARM_UP, 120, log)
        say(f"latency: {total:,} raw messages at {rate:g}/s, linger.ms={linger:g}")

        def send(_n: int) -> None:
            producer.produce(topic, str(time.time_ns()).encode())
            producer.poll(0)

        steady = int(rate * STEADY_AFTER_S)
        _paced(send, rate, steady)
        took = _paced(send, rate, total)
        producer.flush(60)
        lines = _wait_lines(record, WARM_UP + steady + total, 120, log)
    finally:
        stop(consumer)
    return Run(
        "raw confluent-kafka `produce` → `Consumer.poll` in another process",
        linger,
        _sorted_ms(lines, WARM_UP + steady),
        total / took,
    )


def _with_linger(settings: Settings, linger_ms: float) -> Settings:
    producer = settings.producer.model_copy(
        update={"linger_ms": linger_ms, "bulk_linger_ms": linger_ms}
    )
    return settings.model_copy(update={"producer": producer})


def run(
    bootstrap_servers: str,
    rate: float,
    seconds: float,
    workdir: Path,
    warm_up_s: float = BROKER_WARM_UP_S,
) -> Section:
    total = int(rate * seconds)
    default = Settings(bootstrap_servers=bootstrap_servers).producer.linger_ms
    if warm_up_s > 0:
        say(f"latency: warming the broker up, {warm_up_s:g} s of raw messages at {rate:g}/s")
        warm = fresh_namespace(bootstrap_servers, "latency-warm-up")
        _raw(warm, rate, int(rate * warm_up_s), workdir, name="warm-up")
    runs: list[tuple[Run, Run]] = []
    codes: list[int] = []
    for linger in dict.fromkeys([default, 0.0, OLD_LINGER_MS]):
        settings = fresh_namespace(bootstrap_servers, "latency")
        if linger != default:  # else the defaults as they are (a bulk producer of its own)
            settings = _with_linger(settings, linger)
        pipeline, code = _pipeline(settings, rate, total, workdir)
        codes.append(code)
        runs.append((pipeline, _raw(settings, rate, total, workdir)))
    table = [
        "| measured | linger.ms | jobs | offered rate | p50 | p90 | p99 | max | p50 vs raw |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pair in runs:
        raw_p50 = percentile(pair[1].latencies_ms, 0.50)
        for result in pair:
            values = result.latencies_ms
            p50 = percentile(values, 0.50)
            ratio = "baseline" if result is pair[1] else f"{p50 / raw_p50:.1f}x"
            table.append(
                f"| {result.label} | {result.linger_ms:g} | {len(values):,} "
                f"| {result.offered:,.0f} jobs/s | {p50:.2f} ms "
                f"| {percentile(values, 0.90):.2f} ms | {percentile(values, 0.99):.2f} ms "
                f"| {values[-1]:.2f} ms | {ratio} |"
            )
    table += [
        "",
        f"Worker command: `{worker_command_line(WORKER_ARGS)}`; it exited with code(s) "
        f"{', '.join(map(str, codes))} after SIGTERM.",
    ]
    checks: list[tuple[str, bool]] = []
    for pipeline, _raw_run in runs:
        p50 = percentile(pipeline.latencies_ms, 0.50)
        p99 = percentile(pipeline.latencies_ms, 0.99)
        at = f"linger.ms={pipeline.linger_ms:g}"
        if pipeline.linger_ms == default:
            checks.append((f"p50 < 1 ms at the default {at} ({p50:.2f} ms)", p50 < 1.0))
        checks += [
            (f"p50 ≤ 2 ms at {at} ({p50:.2f} ms)", p50 <= 2.0),
            (f"p99 ≤ 15 ms at {at} ({p99:.2f} ms)", p99 <= 15.0),
        ]
    return Section(
        "(c) Enqueue-to-start latency",
        f"Jobs sent one by one at a fixed {rate:g} jobs/s for {seconds:g} s, each carrying "
        "`time.time_ns()` taken just before the send; the receiver subtracts it from its own "
        "clock when the handler starts (pipeline) or the message arrives (raw): same machine, "
        "same clock. Each pair runs on its own fresh namespace, with the producer's default "
        f"`linger.ms` ({default:g}) and with {OLD_LINGER_MS:g}, the default before. Not "
        f"counted: {warm_up_s:g} s of the raw pair at the rate before the first pair, to warm "
        "the broker up (a broker that has just started is slower until its JVM has compiled "
        f"its request paths); in each run, {WARM_UP} warm-up messages sent at once, then "
        f"{STEADY_AFTER_S:g} s at the rate (the numbers are the steady state). The raw pair is "
        "the floor that Kafka, librdkafka and this machine set; at a linger of 5 ms the "
        "linger itself is most of the latency.",
        extra=table,
        goal=goal_line(checks),
    )
