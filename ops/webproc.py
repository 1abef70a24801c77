"""``pipeline web`` as a child process, for the dashboard's tests and its benchmark.

:func:`spawn_web` starts it on a free port (``--port 0``) with the namespace's settings in its
environment; :meth:`WebProcess.listening` tells, from its output, whether it says where it
listens yet. The child gets SIGKILL if the thread that started it dies (Linux), so a killed
run leaves no server behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline._deathsignal import death_signal

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pipeline import Settings

REPO = Path(__file__).resolve().parents[1]
_URL = re.compile(r"dashboard of namespace .* at (http://\S+)")


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn``: the child gets SIGKILL when the thread that started it dies (Linux)."""
    return death_signal(signal.SIGKILL)


def start_logged(
    command: Sequence[str], log: Path, env: Mapping[str, str], cwd: Path
) -> subprocess.Popen[bytes]:
    """Start ``command`` with its stdout and stderr in ``log``, no stdin, dying with its
    parent thread (:func:`die_with_parent`): how ops and the tests start the project's processes."""
    with log.open("wb") as out:
        return subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl, resolved before fork
        )


@dataclass
class WebProcess:
    """One ``pipeline web`` process; :attr:`url` (ending with ``/``) once it listens."""

    process: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def listening(self) -> bool:
        """Whether it printed its URL (then in :attr:`url`)."""
        found = _URL.search(self.output())
        if found:
            self.url = found.group(1)
        return found is not None

    def answers(self) -> bool:
        """Whether ``/healthz`` answers at all (503 while Kafka is not read yet, 401 with
        credentials set)."""
        try:
            with urllib.request.urlopen(self.url + "healthz", timeout=5):
                return True
        except urllib.error.HTTPError as exc:
            return exc.code in (401, 503)
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def spawn_web(
    settings: Settings, log: Path, *args: str, env: Mapping[str, str] | None = None
) -> WebProcess:
    """Start ``pipeline web --port 0 *args`` for ``settings``' cluster and namespace."""
    environment = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "PIPELINE_NAMESPACE": settings.namespace,
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    command = [str(Path(sys.executable).with_name("pipeline")), "web", "--port", "0", *args]
    return WebProcess(start_logged(command, log, environment, REPO), log)
