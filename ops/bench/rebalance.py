"""A worker joins a busy group: how long until it runs a job, and how long the members that
keep partitions stop running theirs, per group protocol and assignor.

``python -m ops.bench.rebalance [--runs N] [--rate R] [--variant NAME]... [--output PATH]
[--logs DIR]``
starts a 3-node local cluster (unless ``PIPELINE_BOOTSTRAP_SERVERS`` is set), makes one
warm-up run that is not counted, and for each run of each variant (interleaved, the order
rotated every run): creates a fresh namespace (6 partitions per topic, replication 3),
enqueues ``bench.stamped`` jobs over the four priorities at ``R`` jobs per second (keyed, so
that every partition gets its share), starts two ``pipeline-worker`` processes, lets them run
steadily, then starts a third and measures:

* from the third worker's process start, from its consumer's start (its ``worker starting`` log
  line, just before it joins the group) and from its first assignment (``partitions assigned``)
  to its first job start;
* for the two members already there, which keep part of their partitions, the longest time
  between two job starts of one member from the third worker's start until 3 s after its first
  job, next to the same measure over the 3 s of steady running before it.

Each handler writes ``R <pid> <ns>`` when it starts (``ops.bench.app``). The section
"Rebalances: a worker joins" of ``docs/benchmarks.md`` is rewritten with ``--output``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from pipeline import Pipeline, Priority, Settings
from pipeline._admin import apply_topics
from pipeline._settings import TopicSettings
from pipeline._topics import worker_group

from .app import RECORD_ENV
from .env import broker, machine, say, start_worker, stop, tail, worker_command_line
from .report import Section, replace_sections

if TYPE_CHECKING:
    import subprocess

TITLE = "Rebalances: a worker joins"
JOB_TYPE = "bench.stamped"
WORKER_ARGS = ["--concurrency", "64"]
STEADY_S = 3.0
AFTER_S = 3.0
JOIN_TIMEOUT_S = 120.0
CONSUMER_PROTOCOL = {"PIPELINE_WORKER__GROUP_PROTOCOL": "consumer"}
VARIANTS: dict[str, dict[str, str]] = {
    "classic, cooperative-sticky": {
        "PIPELINE_WORKER__GROUP_PROTOCOL": "classic",
        "PIPELINE_WORKER__KAFKA_CONSUMER": json.dumps(
            {"partition.assignment.strategy": "cooperative-sticky"}
        ),
        # It does not co-partition: a worker refuses it for the namespace-wide scope of keys.
        "PIPELINE_WORKER__DEDUP_SCOPE": "priority",
    },
    "classic, range": {"PIPELINE_WORKER__GROUP_PROTOCOL": "classic"},
    "consumer (KIP-848), range": CONSUMER_PROTOCOL,
}
ASSIGNMENT_INTERVAL = "consumer (KIP-848), range, assignment interval 0.1 s"
VARIANTS[ASSIGNMENT_INTERVAL] = CONSUMER_PROTOCOL
GROUP_CONFIGS = {ASSIGNMENT_INTERVAL: {"consumer.assignment.interval.ms": "100"}}
"""Group configs the benchmark sets before the workers start (the broker's default for this
one: 1 s between two target assignments of a consumer-protocol group)."""
DEFAULT_VARIANTS = [name for name in VARIANTS if name not in GROUP_CONFIGS]
"""The worker environment of each variant. Everything else is the default: session timeout
45 s, heartbeat interval 1 s (a client setting under classic, a group config the worker sets
under the consumer protocol)."""


@dataclass(frozen=True)
class Run:
    start_to_job: float
    subscribe_to_job: float
    assigned_to_job: float
    kept_gap: float
    steady_gap: float


def _starts(record: Path) -> dict[int, list[int]]:
    """Job start times (ns) by worker pid."""
    found: dict[int, list[int]] = {}
    try:
        text = record.read_text()
    except FileNotFoundError:
        return found
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "R":
            found.setdefault(int(parts[1]), []).append(int(parts[2]))
    return found


def _log_time(log: Path, message: str) -> int:
    """The time (ns) of the first JSON log line with ``message``."""
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("message") == message:
            when = datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            return int(when.timestamp() * 1e9)
    raise RuntimeError(f"no {message!r} line in the worker's log:\n{tail(log)}")


def _longest_gap(times: list[int], start: int, end: int) -> float:
    """The longest time (s) between job starts within ``[start, end]``, counting from the last
    start before ``start``."""
    before = [t for t in times if t < start]
    inside = sorted(t for t in times if start <= t <= end)
    points = ([before[-1]] if before else [start]) + inside + [end]
    return max(b - a for a, b in itertools.pairwise(points)) / 1e9


class JobStream:
    """Enqueues keyed jobs over the four priorities at a steady rate, on a thread."""

    def __init__(
        self, settings: Settings, rate: float, job_ms: float, job_type: str = JOB_TYPE
    ) -> None:
        self._settings = settings
        self._job_type = job_type
        self._rate = rate
        self._payload: dict[str, float] = {"ms": job_ms} if job_ms else {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-stream", daemon=True)

    def __enter__(self) -> JobStream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        priorities = list(Priority)
        began = time.monotonic()
        with Pipeline(self._settings) as app:
            n = 0
            while not self._stop.is_set():
                due = began + n / self._rate
                if due > time.monotonic():
                    self._stop.wait(due - time.monotonic())
                    continue
                app.enqueue(
                    self._job_type,
                    {"n": n, **self._payload},
                    priority=priorities[n % 4],
                    key=str(n),
                )
                n += 1
            app.flush(30)


def _wait_jobs(record: Path, pids: list[int], workers: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not all(_starts(record).get(pid) for pid in pids):
        for worker in workers:
            if worker.poll() is not None:
                raise RuntimeError(f"a worker exited with {worker.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {pids} ran no job within {JOIN_TIMEOUT_S:g}s")
        time.sleep(0.02)


def _set_group_configs(settings: Settings, configs: dict[str, str]) -> None:
    admin = AdminClient(dict(settings.client_config()))
    resource = ConfigResource(
        ResourceType.GROUP,
        worker_group(settings),
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def one_run(
    bootstrap_servers: str,
    env: dict[str, str],
    rate: float,
    workdir: Path,
    *,
    group_configs: dict[str, str] | None = None,
    job_ms: float = 0.0,
) -> Run:
    settings = Settings(
        bootstrap_servers=bootstrap_servers,
        namespace=f"bench-rebalance-{uuid.uuid4().hex[:8]}",
        topics=TopicSettings(replication_factor=3 if "," in bootstrap_servers else 1),
    )
    apply_topics(settings)
    if group_configs:
        _set_group_configs(settings, group_configs)
    record = workdir / f"{settings.namespace}.record"
    environ = {
        RECORD_ENV: str(record),
        "PIPELINE_LOG_FORMAT": "json",
        "PIPELINE_WORKER__RETRIES": "false",  # the retry relay's own group is not measured
        **env,
    }
    logs = [workdir / f"{settings.namespace}.{i}.log" for i in range(3)]
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with JobStream(settings, rate, job_ms):
            workers += [start_worker(settings, WORKER_ARGS, environ, logs[i]) for i in (0, 1)]
            old = [w.pid for w in workers]
            _wait_jobs(record, old, workers)
            time.sleep(STEADY_S)
            steady_from = time.time_ns() - int(STEADY_S * 1e9)
            started = time.time_ns()
            workers.append(start_worker(settings, WORKER_ARGS, environ, logs[2]))
            new = workers[2].pid
            _wait_jobs(record, [new], workers)
            time.sleep(AFTER_S)
        starts = _starts(record)
        first = min(starts[new])
        end = first + int(AFTER_S * 1e9)
        subscribed = _log_time(logs[2], "worker starting")
        assigned = _log_time(logs[2], "partitions assigned")
        return Run(
            start_to_job=(first - started) / 1e9,
            subscribe_to_job=(first - subscribed) / 1e9,
            assigned_to_job=(first - assigned) / 1e9,
            kept_gap=max(_longest_gap(starts[pid], started, end) for pid in old),
            steady_gap=max(_longest_gap(starts[pid], steady_from, started) for pid in old),
        )
    except Exception:
        for log in logs:
            if log.exists():
                say(f"--- {log.name}\n{tail(log)}")
        raise
    finally:
        for worker in workers:
            stop(worker, timeout=30)


def _cell(values: list[float], unit: str = "s") -> str:
    if unit == "ms":
        values = [v * 1000 for v in values]
        return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def section(
    results: dict[str, list[Run]], command: str, rate: float, job_ms: float, kafka: str
) -> Section:
    facts = machine()
    lines = [
        "| protocol, assignor | runs | process start to first job, s | consumer start to "
        "first job, s | first assignment to first job, s | longest pause of a member that "
        "keeps partitions, ms | the same, steady running before, ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in results.items():
        lines.append(
            f"| {name} | {len(runs)} | {_cell([r.start_to_job for r in runs])} "
            f"| {_cell([r.subscribe_to_job for r in runs])} "
            f"| {_cell([r.assigned_to_job for r in runs])} "
            f"| {_cell([r.kept_gap for r in runs], 'ms')} "
            f"| {_cell([r.steady_gap for r in runs], 'ms')} |"
        )
    lines += [
        "",
        "Medians, with the range over the runs in brackets; the variants take turns, after one "
        "warm-up run that is not counted (the first groups of a fresh cluster wait for their "
        "coordinators).",
        "",
        f"Command: `{command}`; date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; workers: "
        f"`{worker_command_line(WORKER_ARGS)}` with `PIPELINE_WORKER__RETRIES=false` (the retry "
        f"relay's group is not measured), two started first, the third once both ran jobs for "
        f"{STEADY_S:g} s; {rate:g} jobs/s over the four priorities (6 partitions each), "
        f"{f'each sleeping {job_ms:g} ms' if job_ms else 'no-ops'}; "
        "session timeout 45 s and heartbeat interval 1 s in every variant. Machine: "
        f"{facts['nproc']} cores (nproc), {facts['RAM']} RAM, {facts['CPU']}, {facts['OS']}; "
        f"Python {facts['Python']}, confluent-kafka {facts['confluent-kafka']} (librdkafka "
        f"{facts['librdkafka']}); Kafka: {kafka}.",
    ]
    return Section(
        TITLE if not job_ms else f"{TITLE}, jobs of {job_ms:g} ms",
        "A third `pipeline-worker` joins two that run a steady stream of jobs "
        "(`python -m ops.bench.rebalance`, `make bench-rebalance`). How long the new worker "
        "takes to run its first job, and the longest time between two job starts of one of "
        "the two members already there (which keep part of their partitions) from the new "
        "worker's start until 3 s after its first job.",
        extra=lines,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.rebalance",
        description="A worker joins a busy group, per group protocol and assignor.",
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each variant (5)")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs per second (200)")
    parser.add_argument(
        "--job-ms", type=float, default=0.0, help="how long each job sleeps (0: a no-op)"
    )
    parser.add_argument(
        "--variant", choices=list(VARIANTS), action="append", help="measure this one (repeatable)"
    )
    parser.add_argument("--output", type=Path, help="rewrite this section of this Markdown file")
    parser.add_argument("--logs", type=Path, help="keep the workers' logs and records here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    given = list(argv if argv is not None else sys.argv[1:])
    if "--logs" in given:  # a place on this machine: not part of the command to repeat
        at = given.index("--logs")
        del given[at : at + 2]
    if args.output is not None and args.output.is_absolute():
        given = [args.output.name if a == str(args.output) else a for a in given]
    command = shlex.join(["python", "-m", "ops.bench.rebalance", *given])
    names = args.variant or DEFAULT_VARIANTS
    results: dict[str, list[Run]] = {name: [] for name in names}
    with broker(nodes=3) as kafka, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        workdir = Path(tmp) if args.logs is None else args.logs
        workdir.mkdir(parents=True, exist_ok=True)
        # The first groups of a fresh cluster wait for their coordinators (seen: 30-55 s).
        say(f"rebalance: warm-up run ({names[0]}), not counted")
        warm_up = one_run(
            kafka.bootstrap_servers, VARIANTS[names[0]], args.rate, workdir, job_ms=args.job_ms
        )
        say(f"rebalance: warm-up {warm_up}")
        for run in range(args.runs):
            for name in names[run % len(names) :] + names[: run % len(names)]:
                say(f"rebalance: {name}, run {run + 1} of {args.runs}")
                result = one_run(
                    kafka.bootstrap_servers,
                    VARIANTS[name],
                    args.rate,
                    workdir,
                    group_configs=GROUP_CONFIGS.get(name),
                    job_ms=args.job_ms,
                )
                say(f"rebalance: {result}")
                results[name].append(result)
        description = kafka.description
    text = section(results, command, args.rate, args.job_ms, description)
    if args.output is not None:
        existing = args.output.read_text() if args.output.is_file() else ""
        args.output.write_text(replace_sections(existing, [text]))
        say(f"rebalance: written to {args.output}")
    print(text.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
