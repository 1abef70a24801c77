"""Where the benchmark runs: the broker (given or started), the machine, worker processes."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import confluent_kafka

from ops.webproc import die_with_parent
from pipeline import Settings
from pipeline._admin import apply_topics

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

REPO_ROOT = Path(__file__).resolve().parents[2]
APP = "ops.bench.app:app"


def say(line: str) -> None:
    """Progress goes to stderr; the results go to the report."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Broker:
    bootstrap_servers: str
    description: str


@contextlib.contextmanager
def broker(nodes: int = 1) -> Iterator[Broker]:
    """``PIPELINE_BOOTSTRAP_SERVERS`` if set, else a fresh local cluster of ``nodes`` (1 or 3)
    stopped afterwards."""
    given = os.environ.get("PIPELINE_BOOTSTRAP_SERVERS")
    if given:
        yield Broker(given, "an existing broker (PIPELINE_BOOTSTRAP_SERVERS), version not probed")
        return
    from pipeline_cli import devbroker

    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as data_dir:
        cluster = devbroker.up(
            nodes=nodes,
            data_dir=Path(data_dir),
            base_port=devbroker.free_base_port(nodes),
            progress=say,
            fresh=True,
        )
        shape = "one KRaft node" if nodes == 1 else f"{nodes} KRaft nodes"
        heap = "1G" if nodes == 1 else "512m each"
        try:
            yield Broker(
                cluster.bootstrap_servers,
                f"Apache Kafka {devbroker.KAFKA_VERSION}, {shape} started by the "
                f"benchmark (`pipeline_cli.devbroker`, heap {heap}), on the same machine",
            )
        finally:
            devbroker.down(Path(data_dir), purge=False)


def fresh_namespace(bootstrap_servers: str, label: str) -> Settings:
    """Settings for a new namespace of its own, with every topic created."""
    settings = Settings(
        bootstrap_servers=bootstrap_servers, namespace=f"bench-{label}-{uuid.uuid4().hex[:8]}"
    )
    apply_topics(settings)
    return settings


def machine() -> dict[str, str]:
    """What the numbers depend on: cores, memory, CPU, Python, the Kafka client."""
    memory = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": str(os.cpu_count()),
        "RAM": memory,
        "CPU": cpu,
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "confluent-kafka": _first(confluent_kafka.version()),
        "librdkafka": _first(confluent_kafka.libversion()),
    }


def rss_bytes() -> int:
    """This process's resident set now (VmRSS), 0 where /proc does not say."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _first(version: object) -> str:
    """``version()`` answers a string or a (string, int) tuple depending on the release."""
    return str(version[0] if isinstance(version, tuple) else version)


def _worker_command() -> list[str]:
    script = Path(sys.executable).parent / "pipeline-worker"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "pipeline_worker"]


def start_worker(
    settings: Settings,
    args: list[str],
    env: Mapping[str, str],
    log: Path,
    *,
    hook: str | None = None,
) -> subprocess.Popen[bytes]:
    """``pipeline-worker --app ops.bench.app:app *args`` in the benchmark's namespace; with
    ``hook``, ``python -m hook worker --app ...`` instead: a benchmark module whose ``worker``
    mode installs a hook in the worker's code, then runs it in-process (:func:`run_worker_here`)."""
    command = _worker_command() if hook is None else [sys.executable, "-m", hook, "worker"]
    environ = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "PIPELINE_NAMESPACE": settings.namespace,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        **env,
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [*command, "--app", APP, *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            cwd=REPO_ROOT,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl, resolved before fork
        )


HOOK_OUT_ENV = "BENCH_HOOK_OUT"
"""Where a hooked worker (see :func:`start_worker`) writes what its hook measured."""


def hooked_parser(prog: str, doc: str | None, rounds: int) -> argparse.ArgumentParser:
    """The options of a benchmark of hooked drains: ``--jobs``, ``--rounds``, ``--output``."""
    from .report import add_output_option

    parser = argparse.ArgumentParser(prog=prog, description=doc)
    parser.add_argument("--jobs", type=int, default=300_000, help="jobs per drain (300,000)")
    parser.add_argument(
        "--rounds", type=int, default=rounds, help=f"drains of each setting ({rounds})"
    )
    add_output_option(parser)
    return parser


def run_worker_here(args: list[str]) -> None:
    """``pipeline-worker *args`` in this process: a hooked worker's (see :func:`start_worker`)."""
    from pipeline_worker import main as worker_main

    sys.argv = ["pipeline-worker", *args]
    worker_main()


def footer(command: str, kafka: str, started: datetime | None = None) -> str:
    """The line under a benchmark's results: its command, when it started (default: now), the
    machine, the client library and the broker."""
    facts = machine()
    when = started if started is not None else datetime.now(UTC)
    return (
        f"Command: `{command}`; date: {when:%Y-%m-%d %H:%M} UTC; machine: {facts['nproc']} "
        f"cores (nproc), {facts['RAM']} RAM, {facts['CPU']}, {facts['OS']}; Python "
        f"{facts['Python']}, confluent-kafka {facts['confluent-kafka']} (librdkafka "
        f"{facts['librdkafka']}); Kafka: {kafka}."
    )


def worker_command_line(args: list[str]) -> str:
    """The worker command as a reader would type it (no machine paths)."""
    return " ".join(["pipeline-worker", "--app", APP, *args])


def stop(process: subprocess.Popen[bytes], timeout: float = 60) -> int:
    """SIGTERM, then SIGKILL if it does not exit in time; return its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""
