"""Objects allocated and Python calls made per job on the worker's path, now and at a baseline.

``python -m ops.bench.job_objects [--jobs N] [--rounds N] [--baseline-ref REF | --no-baseline]``

No Kafka: each measurement runs in a process of its own (the baseline's with that commit's code
first on ``PYTHONPATH``, see :mod:`.baseline`), which builds the worker's event-loop side (its
``Processor``, with default settings, the real Avro codec and the bench app's ``bench.noop``
handler on the thread pool) and feeds it consumed messages made in memory, in batches as the
consumer thread hands them over, until every job's offset is finished. What is counted is the
path a message takes once handed over: decoding, dispatch, the handler call on a pool thread,
the completion back on the loop and the offset tracker; not the consumer thread's grouping of
a batch, the committer or Kafka's client. Three numbers per job, after a warm-up:

* objects allocated (every allocation from CPython's object allocator, freed or not, in every
  thread: see :mod:`.allocations`);
* Python function calls, and calls of C functions from Python (a profile hook counting them);
* microseconds per job without either instrument (noisy: compare within one run).

Processes alternate between the baseline and the current code for ``--rounds`` rounds; the
median of each is printed as Markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from .app import RECORD_ENV, app
from .baseline import Baseline, BaselineError
from .env import REPO_ROOT, say

MODE_ENV = "BENCH_JOB_OBJECTS_MODE"
BATCH = 1000
"""Messages per handed batch (the worker's default ``consume_batch``)."""
PARTITIONS = 6


def _processor_class() -> Any:
    """The worker's Processor, wherever this commit keeps it."""
    try:
        from pipeline_worker.execute.processor import Processor
    except ImportError:  # before the stage packages
        from pipeline_worker._processing import Processor  # type: ignore[import-not-found,no-redef]
    return Processor


def _messages(jobs: int, topic: str) -> list[list[Any]]:
    """``jobs`` encoded no-op jobs as consumed messages, round-robin over the partitions."""
    from confluent_kafka import Message

    from pipeline import Job

    per_partition: list[list[Any]] = [[] for _ in range(PARTITIONS)]
    for n in range(jobs):
        job = Job(id=f"job-{n:08d}", type="bench.noop", payload=json.dumps({"n": n}).encode())
        partition = n % PARTITIONS
        offset = len(per_partition[partition])
        per_partition[partition].append(
            Message(topic=topic, partition=partition, offset=offset, value=app.codec.encode(job))
        )
    return per_partition


async def _drain(jobs: int, warmup: int, measure: Callable[[], int] | None) -> tuple[float, int]:
    """Run ``warmup`` then ``jobs`` jobs; return (seconds, ``measure()`` delta) for the latter."""
    from pipeline import Priority
    from pipeline._workersettings import WorkerSettings
    from pipeline_worker._metrics import WorkerMetrics
    from pipeline_worker._work import PartitionState

    os.environ.setdefault(RECORD_ENV, os.devnull)  # what the handler notes is not needed here
    topic = app.topics.jobs(Priority.DEFAULT)
    worker = WorkerSettings()
    processor = _processor_class()(
        app=app,
        worker=worker,
        priorities=[Priority.DEFAULT],
        topics={Priority.DEFAULT: topic},
        loop=asyncio.get_running_loop(),
        metrics=WorkerMetrics(),
        middleware=[],
        context=contextvars.copy_context(),
    )
    states = [PartitionState(topic, p, Priority.DEFAULT, 0) for p in range(PARTITIONS)]
    messages = _messages(warmup + jobs, topic)
    cursors = [0] * PARTITIONS

    async def feed(until: int) -> None:
        # As the consumer thread would: a batch at a time, partitions in turn, each held back
        # while its buffer is full (buffer_size), until the first ``until`` messages are
        # handed over and every one of them is finished.
        turn = 0
        while processor.finished < until:
            fed = False
            for _ in range(PARTITIONS):
                index = turn % PARTITIONS
                turn += 1
                state, cursor = states[index], cursors[index]
                room = min(BATCH, worker.buffer_size - state.buffered, until - sum(cursors))
                batch = messages[index][cursor : cursor + max(0, room)]
                if batch:
                    cursors[index] = cursor + len(batch)
                    state.handed += len(batch)
                    state.handed_next = batch[-1].offset() + 1
                    processor.on_batch([(state, batch)])
                    fed = True
                    break
            await asyncio.sleep(0 if fed else 0.0005)

    await feed(warmup)
    before = measure() if measure is not None else 0
    began = time.perf_counter()
    await feed(warmup + jobs)
    seconds = time.perf_counter() - began
    counted = (measure() if measure is not None else 0) - before
    await processor.close()
    return seconds, counted


class _CallCounter:
    """A profile hook (every thread) counting Python function calls and C function calls."""

    def __init__(self) -> None:
        self.python = 0
        self.c = 0

    def hook(self, frame: object, event: str, arg: object) -> None:
        # Racy across threads (off by a few at most), and only the loop and one pool thread
        # run here: fine for a count.
        if event == "call":
            self.python += 1
        elif event == "c_call":
            self.c += 1

    def install(self) -> None:
        threading.setprofile(self.hook)  # pool threads start after this
        sys.setprofile(self.hook)

    def uninstall(self) -> None:
        sys.setprofile(None)
        threading.setprofile(None)


def calls_per_job(jobs: int, warmup: int) -> tuple[float, float]:
    """(Python calls, C calls) per job on the worker's path, in this process."""
    calls = _CallCounter()
    calls.install()
    try:
        python = asyncio.run(_drain(jobs, warmup, lambda: calls.python))[1]
        # A second drain for the C calls: each count is read where the other is not moving.
        c = asyncio.run(_drain(jobs, warmup, lambda: calls.c))[1]
    finally:
        calls.uninstall()
    return python / jobs, c / jobs


def _child(mode: str, jobs: int, warmup: int) -> dict[str, float]:
    if mode == "objects":
        from .allocations import AllocationCounter

        counter = AllocationCounter()
        counter.install()
        _, objects = asyncio.run(_drain(jobs, warmup, counter.count))
        return {"objects": objects / jobs}
    if mode == "calls":
        python, c = calls_per_job(jobs, warmup)
        return {"python": python, "c": c}
    seconds, _ = asyncio.run(_drain(jobs, warmup, None))
    return {"us": seconds / jobs * 1e6}


def _run_child(mode: str, jobs: int, warmup: int, baseline: Baseline | None) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(prefix="pipeline-bench-record-") as record:
        env = {
            **os.environ,
            **(baseline.environ() if baseline is not None else {}),
            MODE_ENV: mode,
            "BENCH_RECORD": record.name,
            "BENCH_EXPECTED": "0",
        }
        if baseline is None:
            env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            )
        argv = ["--jobs", str(jobs), "--warmup", str(warmup)]
        result = subprocess.run(
            [sys.executable, "-m", "ops.bench.job_objects", *argv],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"the {mode} measurement failed:\n{result.stderr[-3000:]}")
    return dict(json.loads(result.stdout.strip().splitlines()[-1]))


def measure(
    jobs: int, rounds: int, baseline: Baseline | None, warmup: int = 5000
) -> dict[str, dict[str, float]]:
    """Median per-job figures of the current code (``"now"``) and of ``baseline``."""
    sides: list[tuple[str, Baseline | None]] = [("now", None)]
    if baseline is not None:
        sides.insert(0, ("before", baseline))
    results: dict[str, dict[str, list[float]]] = {name: {} for name, _ in sides}
    for attempt in range(rounds):
        for name, side in sides if attempt % 2 == 0 else sides[::-1]:
            for mode in ("objects", "calls", "time"):
                say(f"job_objects: round {attempt + 1}/{rounds}: {name}: {mode}")
                for key, value in _run_child(mode, jobs, warmup, side).items():
                    results[name].setdefault(key, []).append(value)
    return {
        name: {key: statistics.median(values) for key, values in figures.items()}
        for name, figures in results.items()
    }


def markdown(figures: dict[str, dict[str, float]], ref: str | None, command: str) -> str:
    columns = [("objects", "objects allocated", 1), ("python", "Python calls", 1),
               ("c", "C calls", 1), ("us", "µs (noisy)", 2)]  # fmt: skip
    lines = [
        "| code, per job | " + " | ".join(title for _, title, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    before = figures.get("before")
    for name, row in figures.items():
        label = f"worker at {ref} (before)" if name == "before" else "worker (now)"
        cells = []
        for key, _, digits in columns:
            cell = f"{row[key]:.{digits}f}"
            if before is not None and name == "now":
                cell += f" ({row[key] / before[key]:.0%})"
            cells.append(cell)
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += ["", f"Command: `{command}`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.job_objects",
        description="Objects allocated and calls made per job on the worker's path (no Kafka).",
    )
    parser.add_argument("--jobs", type=int, default=50_000, help="jobs measured (50,000)")
    parser.add_argument("--warmup", type=int, default=5000, help="jobs run first (5,000)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per figure and side (3)")
    from .drain import add_baseline_options, baseline_context

    add_baseline_options(parser)
    args = parser.parse_args(argv)
    mode = os.environ.get(MODE_ENV)
    if mode is not None:  # a measuring child
        print(json.dumps(_child(mode, args.jobs, args.warmup)))
        return 0
    command = " ".join(["python -m ops.bench.job_objects", *(argv or sys.argv[1:])])
    with baseline_context(args.baseline_ref, skip=args.no_baseline) as baseline:
        figures = measure(args.jobs, args.rounds, baseline, args.warmup)
        ref = baseline.ref if baseline is not None else None
    print(markdown(figures, ref, command))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BaselineError as exc:  # says what to do: no traceback
        sys.exit(f"python -m ops.bench.job_objects: {exc}")
