"""Scheduler benchmark: release throughput, lateness, and memory with 1,000,000 pending.

Each measurement runs ``pipeline-scheduler`` as its own process in a fresh namespace. The idle
lateness runs a worker too and is handler start minus due time; the other measurements read the
released jobs with a plain read_committed consumer (receive time minus due time, where a release
``scheduler.release_lead_ms`` early counts as early only beyond that lead).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from ops.webproc import die_with_parent
from pipeline import JobCodec, Pipeline, Settings
from pipeline._topics import TopicNames

from .app import RECORD_ENV
from .env import REPO_ROOT, fresh_namespace, say, start_worker, stop, tail
from .report import Section


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _start(
    settings: Settings, log: Path, env: dict[str, str] | None = None, *, wait: bool = True
) -> subprocess.Popen[bytes]:
    """``pipeline-scheduler`` in ``settings``' namespace; with ``wait``, once it leads."""
    environ = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "PIPELINE_NAMESPACE": settings.namespace,
        **(env or {}),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline_scheduler"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=REPO_ROOT,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl, resolved before fork
        )
    deadline = time.monotonic() + 60
    while wait and " leading " not in log.read_text(errors="replace"):
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"the scheduler did not take the lead:\n{tail(log)}")
        time.sleep(0.05)
    return process


def _consumer(settings: Settings) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.bench-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 5,
        }
    )
    # Assigned, not subscribed: a new group's first join waits for the broker's initial
    # rebalance delay (3 s), which would show up as lateness that the scheduler did not cause.
    topics = TopicNames(settings.namespace).all_jobs()
    metadata = consumer.list_topics(timeout=10)
    consumer.assign(
        [
            TopicPartition(topic, p, OFFSET_BEGINNING)
            for topic in topics
            for p in metadata.topics[topic].partitions
        ]
    )
    return consumer


def _read(consumer: Consumer, count: int, timeout: float) -> list[tuple[int, int]]:
    """(received ms, due ms) of ``count`` released jobs."""
    codec = JobCodec()
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        # poll() returns on the first message; consume(n, 0) then takes what is there. (A
        # consume(n, timeout) would wait for n messages or the timeout, inflating lateness.)
        first = consumer.poll(0.1)
        if first is None:
            continue
        received = _now_ms()
        for message in [first, *consumer.consume(10_000, 0)]:
            if message.error() is None:
                out.append((received, codec.decode(message.value() or b"").not_before or 0))
    return out


def _percentile(values: list[int] | list[float], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(len(ordered) * q))]) if ordered else float("nan")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _caught_up(settings: Settings) -> bool:
    """Whether the scheduler committed <ns>.deferred up to its end."""
    topic = TopicNames(settings.namespace).deferred
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.scheduler.deferred",
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p) for p in parts]
        for tp in consumer.committed(tps, timeout=10):
            _, high = consumer.get_watermark_offsets(tp, timeout=10)
            if tp.offset < high - 1:  # (the last offset may be a transaction marker)
                return False
        return True
    finally:
        consumer.close()


def throughput(bootstrap: str, jobs: int, workdir: Path) -> list[str]:
    settings = fresh_namespace(bootstrap, "sched-tput")
    process = _start(settings, workdir / "sched-tput.log")
    try:
        consumer = _consumer(settings)
        app = Pipeline(settings)
        due_ms = _now_ms() + 5000 + jobs // 20
        from datetime import UTC, datetime

        run_at = datetime.fromtimestamp(due_ms / 1000, tz=UTC)
        app.enqueue_many("bench.noop", ({"i": i} for i in range(jobs)), run_at=run_at)
        app.flush()
        got = _read(consumer, jobs, timeout=120 + jobs / 1000)
        consumer.close()
    finally:
        stop(process)
    last = max(r for r, _ in got) if got else due_ms
    seconds = max(0.001, (last - due_ms) / 1000)
    return [
        f"- Release throughput: {len(got):,} jobs all due at one instant, released in "
        f"{seconds:.2f} s after their due time: **{len(got) / seconds:,.0f} jobs/s** "
        f"(batches of up to 5,000 per transaction).",
    ]


def lateness(
    bootstrap: str, jobs: int, rate: float, workdir: Path, label: str
) -> tuple[float, float]:
    """Handler start minus due time of ``jobs`` delayed jobs, with a scheduler and a worker."""
    settings = fresh_namespace(bootstrap, f"sched-{label}")
    record = workdir / f"sched-{label}.record"
    process = _start(settings, workdir / f"sched-{label}.log")
    worker = start_worker(settings, [], {RECORD_ENV: str(record)}, workdir / f"{label}-w.log")
    try:
        app = Pipeline(settings)
        warm = _warm_up(app, record)
        for i in range(jobs):
            app.enqueue("bench.due", {"n": i}, delay=2.0)
            app.flush()
            time.sleep(1 / rate)  # a steady arrival rate, not a burst
        deadline = time.monotonic() + 60
        while len(_lines(record)) < warm + jobs and time.monotonic() < deadline:
            time.sleep(0.1)
        late_ns = [int(line) for line in _lines(record)[warm:]]
    finally:
        stop(worker)
        stop(process)
    late = [ns / 1e6 for ns in late_ns]
    return _percentile(late, 0.5), _percentile(late, 0.99)


def _lines(path: Path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def _warm_up(app: Pipeline, record: Path) -> int:
    """Send due jobs until the worker owns the partitions and runs them (not measured); return
    how many lines they wrote."""
    deadline = time.monotonic() + 60
    while not _lines(record) and time.monotonic() < deadline:
        app.enqueue("bench.due", {"n": -1}, delay=0.1)
        app.flush()
        time.sleep(0.5)  # pacing the probes, not waiting for a condition
    return len(_lines(record))


def pending(
    bootstrap: str, jobs: int, span_s: float, workdir: Path, *, env: dict[str, str], label: str
) -> list[str]:
    """Scheduler memory with ``jobs`` pending over ``span_s``, and the lateness at the handler
    (start minus due, one worker) of 500 jobs due meanwhile."""
    settings = fresh_namespace(bootstrap, f"sched-{label}")
    process = _start(settings, workdir / f"sched-{label}.log", env)
    record = workdir / f"sched-{label}.record"
    worker = start_worker(settings, [], {RECORD_ENV: str(record)}, workdir / f"{label}-w.log")
    rng = random.Random(1)
    lines = []
    try:
        app = Pipeline(settings)
        t0 = time.monotonic()
        for i in range(jobs):
            app.enqueue("bench.noop", {"i": i}, delay=rng.uniform(120, span_s))
        app.flush()
        say(f"bench: {jobs:,} delayed jobs enqueued in {time.monotonic() - t0:.0f}s")
        deadline = time.monotonic() + 900
        while not _caught_up(settings) and time.monotonic() < deadline:
            time.sleep(1)
        rss = _rss_mb(process.pid)
        lines.append(
            f"- {label}: {jobs:,} jobs pending over {span_s / 3600:g} h: scheduler RSS "
            f"**{rss:.0f} MB** once every one was read (goal < 300 MB)."
        )
        warm = _warm_up(app, record)
        for i in range(500):
            app.enqueue("bench.due", {"n": i}, delay=2.0)
            app.flush()
            time.sleep(0.004)
        deadline = time.monotonic() + 60
        while len(_lines(record)) < warm + 500 and time.monotonic() < deadline:
            time.sleep(0.1)
        late = [int(line) / 1e6 for line in _lines(record)[warm:]]
        lines.append(
            f"  Lateness at the handler of {len(late)} jobs due meanwhile (start minus due, one "
            f"worker): p50 {_percentile(late, 0.5):.1f} ms, p99 {_percentile(late, 0.99):.1f} ms "
            "(goal p99 <= 50 ms)."
        )
    finally:
        stop(worker)
        stop(process)
    return lines


def shortened_clock(bootstrap: str, jobs: int, span_s: float, workdir: Path) -> list[str]:
    """Every job through the wait tiers on a compressed clock: released once, on time?"""
    settings = fresh_namespace(bootstrap, "sched-clock")
    env = {
        "PIPELINE_SCHEDULER__HORIZON_S": "2",
        "PIPELINE_SCHEDULER__WAIT_TIERS_S": "[1, 4, 15, 40]",
    }
    process = _start(settings, workdir / "sched-clock.log", env)
    rng = random.Random(2)
    try:
        consumer = _consumer(settings)
        app = Pipeline(settings)
        for i in range(jobs):
            app.enqueue("bench.noop", {"i": i}, delay=rng.uniform(5, span_s))
        app.flush()
        got = _read(consumer, jobs, timeout=span_s + 120)
        consumer.close()
        rss = _rss_mb(process.pid)
    finally:
        stop(process)
    late = [r - d for r, d in got]
    early = sum(1 for x in late if x < -Settings().scheduler.release_lead_ms)
    return [
        f"- Shortened clock (horizon 2 s, tiers 1/4/15/40 s): {len(got):,} of {jobs:,} jobs "
        f"spread over {span_s:g} s released, {early} early; lateness p50 "
        f"{_percentile(late, 0.5):.0f} ms, p99 {_percentile(late, 0.99):.0f} ms; RSS {rss:.0f} MB."
    ]


def run(bootstrap_servers: str, quick: bool, workdir: Path) -> Section:
    extra: list[str] = []
    say("bench: scheduler release throughput")
    extra += throughput(bootstrap_servers, 10_000 if quick else 200_000, workdir)
    say("bench: scheduler lateness (idle)")
    p50, p99 = lateness(bootstrap_servers, 200 if quick else 2000, 200.0, workdir, "idle")
    extra.append(
        f"- Lateness, idle (jobs due 2 s after enqueue, 200/s; handler start minus due time, "
        f"with one worker): p50 {p50:.1f} ms, p99 {p99:.1f} ms (goal p99 <= 10 ms)."
    )
    say("bench: scheduler with many pending jobs")
    count = 20_000 if quick else 1_000_000
    extra += pending(bootstrap_servers, count, 24 * 3600, workdir, env={}, label="pending-24h")
    say("bench: scheduler on a shortened clock")
    extra += shortened_clock(
        bootstrap_servers, 1_000 if quick else 100_000, 6 if quick else 120, workdir
    )
    return Section(
        title="Scheduler",
        description=(
            "`pipeline-scheduler`: delayed jobs enqueued to `<ns>.deferred`, released to the job "
            "topics. The idle lateness is measured at the handler (one worker runs the jobs: "
            "start time minus due time); the others read the releases with a read_committed "
            "consumer (receive time minus due time; releases come `release_lead_ms`, 200 ms, "
            "early by design, and the worker holds them until due)."
        ),
        extra=extra,
    )
