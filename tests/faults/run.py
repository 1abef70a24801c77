"""One fault scenario's load and its counts: continuous produce, two workers, and at the end
acknowledged, processed once, processed twice or more, and lost = acknowledged - processed
(the way Kafka's own system tests count)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ops.webproc import die_with_parent

from pipeline import Priority
from pipeline._admin import apply_topics
from pipeline._topics import TopicNames, worker_group
from tests.integration.worker.harness import REPO_ROOT, WorkerProcess, wait_joined, wait_until
from tests.integration.worker.scenarios import FAST_FAILOVER
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from pipeline import Settings
    from tests.integration.worker.harness import Recording, WorkerLauncher

    from .netns import HostNetwork

PRODUCER_HOST = "producer"
WORKER_HOSTS = ("hostA", "hostB")
HOSTS = (PRODUCER_HOST, *WORKER_HOSTS)
PRODUCER_ENV = {"PIPELINE_PRODUCER__DELIVERY_TIMEOUT_S": "60"}
"""Long enough that a job waits out a 30 s cut-off instead of failing."""


@dataclass(frozen=True)
class Counts:
    """What became of the jobs of one scenario."""

    scenario: str
    sent: int
    acknowledged: int
    processed_once: int
    processed_twice: int
    """Acknowledged jobs that ran two times or more."""
    lost: int
    """Acknowledged jobs that never ran."""
    unacknowledged_ran: int
    """Jobs Kafka did not acknowledge (refused, timed out) that ran all the same."""
    seconds: float

    def row(self) -> str:
        return (
            f"| {self.scenario} | {self.sent} | {self.acknowledged} | {self.processed_once} | "
            f"{self.processed_twice} | {self.lost} | {self.unacknowledged_ran} | "
            f"{self.seconds:.0f} |"
        )


def read_answers(log: Path) -> tuple[list[str], list[str]]:
    """The producer log's acknowledged job ids, and the ids of the jobs not acknowledged."""
    acknowledged: list[str] = []
    other: list[str] = []
    for line in log.read_text().splitlines():
        kind, job_id, *_ = line.split(" ", 2)
        (acknowledged if kind == "A" else other).append(job_id)
    return acknowledged, other


def count(scenario: str, log: Path, recording: Recording, seconds: float) -> Counts:
    acknowledged, other = read_answers(log)
    runs = recording.run_counts()
    times = Counter(runs[job_id] for job_id in acknowledged)
    return Counts(
        scenario,
        len(acknowledged) + len(other),
        len(acknowledged),
        times[1],
        sum(n for ran, n in times.items() if ran >= 2),
        times[0],
        sum(1 for job_id in other if runs[job_id]),
        seconds,
    )


class FaultRun:
    """Two workers and a producer on a namespace of replicated topics; the test injects faults
    between :meth:`start` and :meth:`finish`. With a :class:`HostNetwork` the producer and each
    worker run on their own host (namespace), else all run here."""

    def __init__(
        self,
        settings: Settings,
        launcher: WorkerLauncher,
        recording: Recording,
        work_dir: Path,
        *,
        network: HostNetwork | None = None,
        rate: float = 50.0,
    ) -> None:
        self.settings = settings
        self.launcher = launcher
        self.recording = recording
        self.log = work_dir / "answers.log"
        self.network = network
        self.rate = rate
        self.group = worker_group(settings)
        self.workers: list[WorkerProcess] = []
        self.producer: subprocess.Popen[bytes] | None = None
        self._producer_out = work_dir / "producer.out"
        self._began = 0.0

    def _prefix(self, host: str) -> Sequence[str]:
        return self.network.prefix(host) if self.network is not None else ()

    def start(self) -> FaultRun:
        """Creates the topics, starts both workers and the producer, and waits until jobs run."""
        apply_topics(self.settings)
        for host in WORKER_HOSTS:
            self.workers.append(
                self.launcher.start(
                    "--concurrency", "20", env=FAST_FAILOVER, prefix=self._prefix(host)
                )
            )
        wait_joined(self.settings, self.group, self.workers, stable=False)
        command = [*self._prefix(PRODUCER_HOST), sys.executable, "-m", "tests.faults.produce"]
        with self._producer_out.open("wb") as out:
            self.producer = subprocess.Popen(
                [*command, str(self.log), str(self.rate)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.launcher.environment(PRODUCER_ENV),
                cwd=REPO_ROOT,
                preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl, resolved before fork
            )
        self._began = time.monotonic()
        self.wait_running()
        return self

    def wait_running(self, jobs: int | None = None, timeout: float = 120) -> None:
        """Wait until ``jobs`` more jobs (default: two seconds' worth) ran from now."""
        wanted = self.recording.count("S") + (jobs or int(2 * self.rate))
        wait_until(
            lambda: self.recording.count("S") >= wanted,
            timeout=timeout,
            what=lambda: (
                f"{wanted} job runs (have {self.recording.count('S')}) {self.producer_output()}"
            ),
            watch=self.workers,
            interval=0.2,
        )

    def runs_of(self, worker: WorkerProcess, since_ns: int, until_ns: int | None = None) -> int:
        """How many runs ``worker`` started between ``since_ns`` and ``until_ns`` (wall clock)."""
        return sum(
            1
            for event in self.recording.starts()
            if event.pid == worker.pid
            and event.time_ns >= since_ns
            and (until_ns is None or event.time_ns <= until_ns)
        )

    def wait_ran_on(self, worker: WorkerProcess, jobs: int = 20, timeout: float = 120) -> None:
        """Wait until ``worker`` started ``jobs`` runs from now (it has partitions again)."""
        since = time.time_ns()
        wait_until(
            lambda: self.runs_of(worker, since) >= jobs,
            timeout=timeout,
            what=f"{jobs} runs on worker pid {worker.pid}\n{worker.log_tail()}",
            watch=self.workers,
            interval=0.2,
        )

    def producer_output(self) -> str:
        text = self._producer_out.read_text(errors="replace") if self._producer_out.exists() else ""
        return f"--- producer output ---\n{text[-3000:]}"

    def finish(self, scenario: str, timeout: float = 180) -> Counts:
        """Stops producing, waits (``timeout`` at most) until every acknowledged job ran, counts."""
        assert self.producer is not None
        self.producer.terminate()
        try:
            code = self.producer.wait(120)
        except subprocess.TimeoutExpired:
            self.producer.kill()
            raise AssertionError(f"the producer did not stop\n{self.producer_output()}") from None
        assert code == 0, self.producer_output()
        seconds = time.monotonic() - self._began
        acknowledged, _ = read_answers(self.log)
        wait_for(lambda: self.recording.all_finished(acknowledged), timeout, interval=0.5)
        counts = count(scenario, self.log, self.recording, seconds)
        print(f"\n{counts}\n{counts.row()}", flush=True)
        return counts

    def hosts_of_priorities(self) -> dict[str, set[int]]:
        """Per priority topic, the worker pids that ran its jobs."""
        topics = {TopicNames(self.settings.namespace).jobs(p): p.value for p in Priority}
        ran: dict[str, set[int]] = {p.value: set() for p in Priority}
        for event in self.recording.starts():
            if event.topic in topics:
                ran[topics[event.topic]].add(event.pid)
        return ran

    def close(self) -> None:
        if self.producer is not None and self.producer.poll() is None:
            self.producer.kill()
            self.producer.wait()
        for worker in self.workers:
            worker.kill()
