"""Worker processes, and waiting for conditions with deadlines instead of sleeping blindly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ops.webproc import start_logged

from ..apps.recording import RECORD_ENV

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pipeline import Settings

REPO_ROOT = Path(__file__).resolve().parents[4]
RECORDING_APP = "tests.integration.worker.apps.recording:app"
TRACEBACK = "Traceback (most recent call last)"


def wait_until(
    condition: Callable[[], bool],
    *,
    timeout: float,
    what: str | Callable[[], str],
    watch: Sequence[WorkerProcess] = (),
    interval: float = 0.05,
) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds saying ``what``.

    A worker in ``watch`` that exits while we wait fails the wait at once, with its output.
    """
    deadline = time.monotonic() + timeout
    next_log_check = time.monotonic() + 1.0
    while not condition():
        for worker in watch:
            if not worker.alive():
                raise AssertionError(
                    f"worker pid {worker.pid} exited with {worker.returncode} while waiting for "
                    f"{_describe(what)}\n{worker.log_tail()}"
                )
        if watch and time.monotonic() >= next_log_check:
            # The recording app's handlers never raise: a traceback is the worker's own error,
            # and waiting on would only turn it into a timeout.
            for worker in watch:
                if TRACEBACK in worker.log():
                    raise AssertionError(
                        f"worker pid {worker.pid} logged an exception while waiting for "
                        f"{_describe(what)}\n{worker.log_tail()}"
                    )
            next_log_check = time.monotonic() + 1.0
        if time.monotonic() >= deadline:
            logs = "\n".join(w.log_tail() for w in watch)
            raise AssertionError(
                f"timed out after {timeout:g}s waiting for {_describe(what)}\n{logs}"
            )
        time.sleep(interval)


def _describe(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


# --- Worker processes --------------------------------------------------------------------------


def _worker_command() -> list[str]:
    script = Path(sys.executable).parent / "pipeline-worker"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "pipeline_worker"]


class WorkerProcess:
    """One ``pipeline-worker`` process; its stdout and stderr go to ``log_path``."""

    def __init__(
        self, popen: subprocess.Popen[bytes], log_path: Path, args: Sequence[str], client_id: str
    ) -> None:
        self.popen = popen
        self.log_path = log_path
        self.args = list(args)
        self.client_id = client_id

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def terminate(self) -> None:
        """SIGTERM: a graceful stop."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.alive():
            self.popen.kill()
        self.popen.wait()

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; fail with its output if it is still running."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker pid {self.pid} ({' '.join(self.args)}) still running after {timeout:g}s"
                f"\n{self.log_tail()}"
            ) from None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        tail = "\n".join(self.log().splitlines()[-lines:])
        return f"--- worker pid {self.pid} output ({self.log_path}), last {lines} lines ---\n{tail}"


@dataclass
class WorkerLauncher:
    """Starts workers on the recording app; :meth:`stop_all` kills every one still running.

    Start workers from the test's main thread: each is killed when the thread that started it
    dies (``PR_SET_PDEATHSIG``), which is what guarantees no process outlives the test run.
    """

    settings: Settings
    record_path: Path
    log_dir: Path
    app: str = RECORDING_APP
    env: dict[str, str] = field(default_factory=dict)
    started: list[WorkerProcess] = field(default_factory=list)

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        python_path = [str(REPO_ROOT)]
        if env.get("PYTHONPATH"):
            python_path.append(env["PYTHONPATH"])
        env.update(
            {
                "PIPELINE_BOOTSTRAP_SERVERS": self.settings.bootstrap_servers,
                "PIPELINE_NAMESPACE": self.settings.namespace,
                RECORD_ENV: str(self.record_path),
                "PYTHONPATH": os.pathsep.join(python_path),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env)
        env.update(extra or {})
        return env

    def start(
        self, *args: str, env: Mapping[str, str] | None = None, prefix: Sequence[str] = ()
    ) -> WorkerProcess:
        """Start ``pipeline-worker --app <recording app> *args`` (after ``prefix``, e.g.
        ``ip netns exec <namespace>``, which must exec the worker in the same process).

        Each worker gets its own Kafka client id (``worker-<n>``), so the group's member list
        tells which worker is a member.
        """
        number = len(self.started) + 1
        command = [*prefix, *_worker_command(), "--app", self.app, *args]
        log_path = self.log_dir / f"worker-{number}.log"
        client_id = f"worker-{number}"
        environment = self.environment({"PIPELINE_CLIENT_ID": client_id, **(env or {})})
        popen = start_logged(command, log_path, environment, REPO_ROOT)
        worker = WorkerProcess(popen, log_path, command, client_id)
        self.started.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            worker.kill()
