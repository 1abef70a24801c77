"""A throwaway PostgreSQL cluster for the outbox's tests and benchmark.

:func:`start_postgres` runs ``initdb`` in a directory of its own and starts ``postgres`` on a free
localhost port (no Unix socket outside that directory), with durability off: the data is thrown
away. The binaries come from ``pg_config --bindir``, Debian's ``/usr/lib/postgresql/<version>/bin``
or ``PATH`` (CI installs Debian's ``postgresql`` package). PostgreSQL refuses to run as root, so
as root both run as the ``postgres`` user (the package creates it), else as ``nobody``.
The server gets SIGKILL if the thread that started it dies (Linux), and :meth:`stop` ends it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .webproc import die_with_parent

__all__ = ["PostgresError", "PostgresServer", "find_bindir", "start_postgres"]

_VERSION = re.compile(r"/(\d+)/bin$")


class PostgresError(RuntimeError):
    """PostgreSQL is not installed, or the throwaway cluster did not start."""


def find_bindir() -> Path:
    """The directory of ``initdb`` and ``postgres``."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        found = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False, timeout=10
        )
        if found.returncode == 0:
            candidates.append(Path(found.stdout.strip()))
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(m.group(1)) if (m := _VERSION.search(str(p))) else 0,
        reverse=True,
    )
    candidates.extend(debian)
    initdb = shutil.which("initdb")
    if initdb is not None:
        candidates.append(Path(initdb).resolve().parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    raise PostgresError(
        "PostgreSQL's initdb and postgres are not installed (Debian: apt-get install postgresql)"
    )


def _server_user() -> str | None:
    """Who runs initdb and postgres: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PostgresError("running as root, and neither a postgres nor a nobody user exists")


def _become(user: str | None) -> Callable[[], None] | None:
    """A ``preexec_fn``: become ``user`` (when given), then get SIGKILL when the starting thread
    dies. In that order: changing the uid clears the death signal (so Popen's ``user=`` cannot
    be used with :func:`~ops.webproc.die_with_parent`)."""
    if user is None:
        return die_with_parent()
    entry = pwd.getpwnam(user)
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not in the forked child

    def become() -> None:
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return become


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresServer:
    """A running throwaway cluster; :attr:`dsn` connects as its superuser ``postgres``."""

    base: Path
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT: clients are disconnected), SIGKILL if it takes too long."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_postgres(base: Path, timeout: float = 60.0) -> PostgresServer:
    """A new cluster in ``base`` (empty or missing; as root, its parent must be one the server's
    user can traverse, e.g. ``tempfile.mkdtemp()`` itself), serving on a free port."""
    bindir = find_bindir()
    user = _server_user()
    data, sockets, log = base / "data", base / "sockets", base / "postgres.log"
    base.mkdir(parents=True, exist_ok=True)
    sockets.mkdir(exist_ok=True)
    if user is not None:
        for path in (base, sockets):
            shutil.chown(path, user)
    initdb = subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        user=user,
        cwd=base,
    )
    if initdb.returncode != 0:
        raise PostgresError(f"initdb failed ({initdb.returncode}): {initdb.stderr[-2000:]}")
    port = _free_port()
    with log.open("wb") as out:
        if user is not None:
            shutil.chown(log, user)
        process = subprocess.Popen(
            [
                str(bindir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-k",
                str(sockets),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=base,
            preexec_fn=_become(user),  # noqa: PLW1509 - set*id and prctl, resolved before fork
        )
    server = PostgresServer(base, port, process, log)
    deadline = time.monotonic() + timeout
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise PostgresError(
                f"postgres did not accept connections on port {port} within {timeout:g}s "
                f"(exit code {process.poll()}): {server.output()[-2000:]}"
            )
        time.sleep(0.1)
    return server


def _answers(port: int) -> bool:
    """Whether the server accepts a connection and answers a query."""
    import psycopg

    try:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False
