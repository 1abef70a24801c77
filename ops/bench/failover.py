"""Recovery after a crash: how long a SIGKILLed worker's partitions stand idle, and how long a
SIGKILLed scheduler leader's delayed jobs wait for the standby.

``python -m ops.bench.failover [--runs N] [--part worker|scheduler]... [--protocol
consumer|classic]... [--rate R] [--output PATH] [--logs DIR]`` uses ``PIPELINE_BOOTSTRAP_SERVERS``
if set, else starts a one-node local broker (``pipeline dev up``'s configuration), and with the
settings' defaults (nothing about timeouts is overridden) measures:

* **worker**, per group protocol: in a fresh namespace, ``bench.placed`` jobs keyed over the four
  priorities at ``R`` jobs per second (every partition gets its share); two ``pipeline-worker``
  processes share the partitions and run them steadily; one is SIGKILLed. For each partition the
  dead worker ran last, the time from the kill to the first job the survivor starts on it (each
  handler writes ``P <pid> <topic> <partition> <ns>``, ``ops.bench.app``): the first partition
  back and the last one (the dead worker's partitions all run again);
* **scheduler**: a leader and one standby (both members of the leadership group), delayed jobs
  due every 100 ms; the leader is SIGKILLed; the time from the kill to the first job released
  that only the standby can have released (due later than the kill plus
  ``scheduler.release_lead_ms``), as a read_committed reader receives it.

The sections "Failover: a worker is SIGKILLed" and "Failover: the scheduler leader is SIGKILLed"
of ``docs/benchmarks.md`` are rewritten with ``--output``.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined, unused-ignore]

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline._groupconfig import heartbeat_interval_ms
from pipeline._topics import scheduler_group
from pipeline_scheduler._leadership import heartbeat_interval_ms as leadership_heartbeat_ms

from .app import RECORD_ENV
from .env import broker, footer, say, start_worker, stop, tail, worker_command_line
from .rebalance import JobStream
from .report import Section, replace_sections
from .scheduler import _consumer, _read
from .scheduler import _start as start_scheduler

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

WORKER_TITLE = "Failover: a worker is SIGKILLed"
SCHEDULER_TITLE = "Failover: the scheduler leader is SIGKILLed"
JOB_TYPE = "bench.placed"
WORKER_ARGS = ["--concurrency", "16"]
STEADY_S = 3.0
RECOVERY_TIMEOUT_S = 150.0
DUE_EVERY_MS = 100
PROTOCOLS = ("consumer", "classic")

Partition = tuple[str, int]


@dataclass(frozen=True)
class WorkerRun:
    partitions: int
    """How many partitions the dead worker ran last."""
    first_s: float
    last_s: float


def _placed(record: Path) -> list[tuple[int, Partition, int]]:
    """(pid, partition, start ns) of every job start recorded."""
    try:
        text = record.read_text()
    except FileNotFoundError:
        return []
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == "P":
            found.append((int(parts[1]), (parts[2], int(parts[3])), int(parts[4])))
    return found


def _last_runner(record: Path, before: int) -> dict[Partition, int]:
    """The pid that started the last job of each partition before ``before`` (ns)."""
    last: dict[Partition, tuple[int, int]] = {}
    for pid, partition, at in _placed(record):
        if at < before and at >= last.get(partition, (0, 0))[1]:
            last[partition] = (pid, at)
    return {partition: pid for partition, (pid, _) in last.items()}


def _wait(what: str, done: Callable[[], bool], processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while not done():
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"a process exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {RECOVERY_TIMEOUT_S:g}s")
        time.sleep(0.02)


def worker_run(bootstrap_servers: str, protocol: str, rate: float, workdir: Path) -> WorkerRun:
    settings = Settings(
        bootstrap_servers=bootstrap_servers, namespace=f"bench-failover-{uuid.uuid4().hex[:8]}"
    )
    apply_topics(settings)  # sets the consumer protocol's group configs from the defaults
    record = workdir / f"{settings.namespace}.record"
    environ = {
        RECORD_ENV: str(record),
        "PIPELINE_WORKER__RETRIES": "false",  # the retry relay's own group is not measured
        "PIPELINE_WORKER__GROUP_PROTOCOL": protocol,
    }
    logs = [workdir / f"{settings.namespace}.{i}.log" for i in range(2)]
    everything = len(settings.worker.priorities) * settings.topics.partitions
    workers: list[subprocess.Popen[bytes]] = []
    try:
        with JobStream(settings, rate, 0.0, JOB_TYPE):
            workers += [start_worker(settings, WORKER_ARGS, environ, log) for log in logs]
            victim, survivor = workers

            def shared() -> bool:
                owners = _last_runner(record, time.time_ns())
                return len(owners) == everything and set(owners.values()) == {
                    victim.pid,
                    survivor.pid,
                }

            _wait("both workers to run jobs of every partition", shared, workers)
            time.sleep(STEADY_S)  # steady running, the group settled
            killed = time.time_ns()
            victim.kill()
            victim.wait()
            owned = {p for p, pid in _last_runner(record, killed).items() if pid == victim.pid}
            back: dict[Partition, int] = {}

            def resumed() -> bool:
                for pid, partition, at in _placed(record):
                    if pid == survivor.pid and partition in owned and at > killed:
                        back[partition] = min(at, back.get(partition, at))
                return set(back) == owned

            _wait("the survivor to run every partition of the dead worker", resumed, [survivor])
        return WorkerRun(
            partitions=len(owned),
            first_s=(min(back.values()) - killed) / 1e9,
            last_s=(max(back.values()) - killed) / 1e9,
        )
    except Exception:
        for log in logs:
            say(f"--- {log.name}\n{tail(log)}")
        raise
    finally:
        for worker in workers:
            stop(worker, timeout=30)


def _members(settings: Settings) -> int:
    admin = AdminClient(dict(settings.client_config()))
    group = scheduler_group(settings)
    description = admin.describe_consumer_groups([group], request_timeout=10)[group]
    return len(description.result(timeout=15).members)


def scheduler_run(bootstrap_servers: str, workdir: Path) -> float:
    """Seconds from the leader's SIGKILL to the first job only the standby can have released."""
    settings = Settings(
        bootstrap_servers=bootstrap_servers, namespace=f"bench-failover-{uuid.uuid4().hex[:8]}"
    )
    apply_topics(settings)
    logs = [workdir / f"{settings.namespace}.scheduler.{i}.log" for i in range(2)]
    first_due_s = time.time() + 5.0
    with Pipeline(settings) as app:
        for i in range(int(2 * RECOVERY_TIMEOUT_S * 1000 / DUE_EVERY_MS)):
            due = datetime.fromtimestamp(first_due_s + i * DUE_EVERY_MS / 1000, UTC)
            app.enqueue("bench.due", {"n": i}, run_at=due)
        app.flush(30)
    consumer = _consumer(settings)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        processes.append(start_scheduler(settings, logs[0]))
        processes.append(start_scheduler(settings, logs[1], wait=False))
        _wait("the standby to join the leadership group", lambda: _members(settings) == 2, [])
        while not _read(consumer, 1, timeout=1):  # releases flow
            if time.time() > first_due_s + 60:
                raise RuntimeError("the leader released nothing")
        time.sleep(STEADY_S)
        _read(consumer, 10**9, timeout=0.2)  # what was released before the kill
        killed_ms = time.time_ns() // 1_000_000
        processes[0].kill()
        processes[0].wait()
        only_standby = killed_ms + settings.scheduler.release_lead_ms
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            released = [got for got, due in _read(consumer, 1, timeout=1) if due > only_standby]
            if released:
                return (min(released) - killed_ms) / 1000
        raise RuntimeError(f"the standby released nothing:\n{tail(logs[1])}")
    except Exception:
        for log in logs:
            say(f"--- {log.name}\n{tail(log)}")
        raise
    finally:
        consumer.close()
        for process in processes:
            stop(process, timeout=30)


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} | {max(values):.2f}"


def worker_section(
    results: dict[str, list[WorkerRun]], command: str, rate: float, kafka: str
) -> Section:
    worker = Settings().worker
    session = worker.session_timeout_ms
    lines = [
        "| group protocol | runs | partitions of the dead worker | first back, median s | "
        "first back, max s | all back, median s | all back, max s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for protocol, runs in results.items():
        lines.append(
            f"| {protocol} | {len(runs)} | {statistics.median(r.partitions for r in runs):g} "
            f"| {_cell([r.first_s for r in runs])} | {_cell([r.last_s for r in runs])} |"
        )
    lines += [
        "",
        f"Defaults: `worker.session_timeout_ms` {session:,}, heartbeat interval "
        f"{heartbeat_interval_ms(session):,} ms (a group config under the consumer protocol, "
        f"which `pipeline topics apply` sets). Workers: `{worker_command_line(WORKER_ARGS)}` "
        "with `PIPELINE_WORKER__RETRIES=false` (the retry relay's group is not measured), "
        f"{rate:g} jobs/s over the four priorities (6 partitions each), no-ops; killed after "
        f"both ran jobs of every partition and {STEADY_S:g} s of steady running.",
        "",
        footer(command, kafka),
    ]
    return Section(
        WORKER_TITLE,
        "Two `pipeline-worker` processes share the priority partitions under a steady stream "
        "of jobs; one is SIGKILLed (`python -m ops.bench.failover --part worker`, `make "
        "bench-failover`). From the kill to the first job the survivor starts on each "
        "partition the dead worker ran: the first partition back and the last one.",
        extra=lines,
    )


def scheduler_section(runs: list[float], command: str, kafka: str) -> Section:
    sched = Settings().scheduler
    lines = [
        "| runs | kill to first release by the standby, median s | max s |",
        "|---:|---:|---:|",
        f"| {len(runs)} | {_cell(runs)} |",
        "",
        f"Defaults: `scheduler.session_timeout_ms` {sched.session_timeout_ms:,}, heartbeat "
        f"interval {leadership_heartbeat_ms(sched.session_timeout_ms):,} ms. Delayed "
        f"`bench.due` jobs due every {DUE_EVERY_MS} ms; the leader killed after {STEADY_S:g} s "
        "of releases with the standby in the group; counted: the first job received "
        "(read_committed) that was due later than the kill plus `release_lead_ms` "
        f"({sched.release_lead_ms} ms), which only the standby can have released.",
        "",
        footer(command, kafka),
    ]
    return Section(
        SCHEDULER_TITLE,
        "A `pipeline-scheduler` leader and one standby; the leader is SIGKILLed (`python -m "
        "ops.bench.failover --part scheduler`, `make bench-failover`). From the kill to the "
        "standby's first release.",
        extra=lines,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ops.bench.failover",
        description="Recovery after a SIGKILL: a worker's partitions, the scheduler's lead.",
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each measurement (5)")
    parser.add_argument("--rate", type=float, default=200.0, help="jobs per second (200)")
    parser.add_argument(
        "--part", choices=["worker", "scheduler"], action="append", help="(repeatable; both)"
    )
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, action="append", help="worker group protocol (both)"
    )
    parser.add_argument("--output", type=Path, help="rewrite these sections of this Markdown file")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs and records here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    given = list(argv if argv is not None else sys.argv[1:])
    if "--logs" in given:  # a place on this machine: not part of the command to repeat
        at = given.index("--logs")
        del given[at : at + 2]
    if args.output is not None and args.output.is_absolute():
        given = [args.output.name if a == str(args.output) else a for a in given]
    command = shlex.join(["python", "-m", "ops.bench.failover", *given])
    parts = args.part or ["worker", "scheduler"]
    protocols = args.protocol or list(PROTOCOLS)
    sections: list[Section] = []
    with broker() as kafka, tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        workdir = Path(tmp) if args.logs is None else args.logs
        workdir.mkdir(parents=True, exist_ok=True)
        if "worker" in parts:
            results: dict[str, list[WorkerRun]] = {p: [] for p in protocols}
            for run in range(args.runs):
                for protocol in (
                    protocols[run % len(protocols) :] + protocols[: run % len(protocols)]
                ):
                    say(f"failover: worker, {protocol}, run {run + 1} of {args.runs}")
                    result = worker_run(kafka.bootstrap_servers, protocol, args.rate, workdir)
                    say(f"failover: {result}")
                    results[protocol].append(result)
            sections.append(worker_section(results, command, args.rate, kafka.description))
        if "scheduler" in parts:
            takeovers = []
            for run in range(args.runs):
                say(f"failover: scheduler, run {run + 1} of {args.runs}")
                takeovers.append(scheduler_run(kafka.bootstrap_servers, workdir))
                say(f"failover: standby released after {takeovers[-1]:.2f}s")
            sections.append(scheduler_section(takeovers, command, kafka.description))
    if args.output is not None:
        existing = args.output.read_text() if args.output.is_file() else ""
        args.output.write_text(replace_sections(existing, sections))
        say(f"failover: written to {args.output}")
    for text in sections:
        print(text.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
