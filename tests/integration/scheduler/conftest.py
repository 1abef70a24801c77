"""Scheduler processes for the tests: started as ``python -m pipeline_scheduler``, always killed.

Tests shorten the scheduler's clock through settings (a short horizon and wait tiers) passed as
``PIPELINE_SCHEDULER__*`` environment variables, the same way an operator would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError

from pipeline import Job, JobCodec
from pipeline._admin import apply_topics
from pipeline._settings import Settings
from pipeline._topics import TopicNames

REPO = Path(__file__).resolve().parents[3]


@dataclass
class SchedulerProcess:
    """One ``pipeline-scheduler`` child process; its log goes to ``log``."""

    process: subprocess.Popen[bytes]
    log: Path

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@dataclass
class SchedulerFactory:
    settings: Settings
    tmp: Path
    started: list[SchedulerProcess] = field(default_factory=list)

    def start(
        self, extra_env: dict[str, str] | None = None, app: str | None = None
    ) -> SchedulerProcess:
        env = {
            **os.environ,
            "PIPELINE_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
            "PIPELINE_NAMESPACE": self.settings.namespace,
            **(extra_env or {}),
        }
        log = self.tmp / f"scheduler-{len(self.started)}.log"
        command = [sys.executable, "-m", "pipeline_scheduler", "--log-level", "INFO"]
        if app is not None:
            command += ["--app", app]
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO
            )
        started = SchedulerProcess(process, log)
        self.started.append(started)
        return started

    def wait_leading(self, process: SchedulerProcess, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if " leading " in process.output() or process.output().rstrip().endswith("leading"):
                return
            if process.process.poll() is not None:
                pytest.fail(f"scheduler exited:\n{process.output()}")
            time.sleep(0.1)  # polling a log file with a deadline
        pytest.fail(f"scheduler did not lead within {timeout}s:\n{process.output()}")


@pytest.fixture
def topics(settings: Settings) -> Settings:
    apply_topics(settings)
    return settings


@pytest.fixture
def schedulers(topics: Settings, tmp_path: Path) -> Iterator[SchedulerFactory]:
    factory = SchedulerFactory(topics, tmp_path)
    try:
        yield factory
    finally:
        for process in factory.started:
            process.kill()


@dataclass(frozen=True)
class Released:
    job: Job
    topic: str
    timestamp_ms: int
    received_ms: int


def job_consumer(settings: Settings) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"{settings.namespace}.test-reader",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe(TopicNames(settings.namespace).all_jobs())
    return consumer


def collect(
    consumer: Consumer,
    count: int,
    timeout: float,
    until: Any = None,
    job_type: str | None = None,
) -> list[Released]:
    """Read job messages until ``count`` arrived (or ``until()`` is true) or ``timeout`` passed;
    with ``job_type``, only the jobs of that type are kept and counted."""
    codec = JobCodec()
    out: list[Released] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        if until is not None and until():
            break
        for message in consumer.consume(5000, 0.2):
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error.str()
                continue
            received = time.time_ns() // 1_000_000
            job = codec.decode(message.value() or b"")
            if job_type is not None and job.type != job_type:
                continue
            out.append(
                Released(
                    job,
                    message.topic() or "",
                    message.timestamp()[1],
                    received,
                )
            )
    return out


def scheduler_env(**values: Any) -> dict[str, str]:
    """``PIPELINE_SCHEDULER__<NAME>`` variables for ``values`` (lists as JSON)."""
    return {
        f"PIPELINE_SCHEDULER__{name.upper()}": json.dumps(v) if isinstance(v, list) else str(v)
        for name, v in values.items()
    }
