"""The local Kafka's processes: errors, locks, a node's files and pid, signals and ports.

Everything here is about one machine's processes and sockets; which nodes make a cluster and how
they are configured is :mod:`pipeline_cli.devbroker`. A pid is only ever signalled after its
command line was checked to be the broker of that node, so a stale pid file never names another
process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline._errors import PipelineError

STOP_TIMEOUT_S = 60.0

_LOCK_FILE = ".lock"
# Children spawned by this process, kept so they are reaped (no zombies, no ResourceWarning).
_children: dict[int, subprocess.Popen[bytes]] = {}


class DevBrokerError(PipelineError):
    """The local Kafka could not be started or stopped; the message says why and what to do."""


class PortInUseError(DevBrokerError):
    """A port the cluster needs is taken by another process."""

    def __init__(self, message: str, port: int) -> None:
        super().__init__(message)
        self.port = port


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``path`` so concurrent processes take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _tail_file(path: Path, lines: int = 20) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            return _tail(handle.read().decode(errors="replace"), lines)
    except OSError:
        return ""


# --- Nodes, their files and their processes ----------------------------------------------------


@dataclass(frozen=True)
class DevNode:
    """One combined broker+controller node: its ports and the files under its directory."""

    index: int
    port: int
    controller_port: int
    dir: Path
    host: str = "localhost"
    """The address clients and the other brokers reach this node's broker on."""

    @property
    def node_id(self) -> int:
        return self.index + 1

    @property
    def address(self) -> str:
        """``host:port`` of the broker."""
        return f"{self.host}:{self.port}"

    @property
    def properties_file(self) -> Path:
        return self.dir / "node.properties"

    @property
    def log4j_file(self) -> Path:
        return self.dir / "log4j2.yaml"

    @property
    def pid_file(self) -> Path:
        return self.dir / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def data_path(self) -> Path:
        return self.dir / "data"

    def pid(self) -> int | None:
        """The pid of this node's running broker; a stale pid file never names another process."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _is_node_process(pid, self) else None


def _cmdline(pid: int) -> list[str] | None:
    proc = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():
        try:
            args = proc.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return None
        return [a for a in args if a] or None  # a zombie has an empty command line
    # No /proc (macOS): ps prints the arguments joined by spaces; a path with a space then
    # fails to match, which errs on the safe side (the process is not ours).
    try:
        out = subprocess.run(
            ["ps", "-ww", "-o", "args=", "-p", str(pid)],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.split() or None


def _pid_running(pid: int) -> bool:
    """Whether ``pid`` has not finished exiting (its sockets may still be open until then)."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        # Reaped now or long ago: the pid may since belong to another process, so ask /proc.
        del _children[pid]
    try:
        # The state follows the parenthesised command name; Z (zombie) has closed its files.
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc (macOS): signal 0 tells whether it exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


def _is_node_process(pid: int, node: DevNode) -> bool:
    if not _pid_running(pid):
        return False
    args = _cmdline(pid)
    return bool(
        args
        and Path(args[0]).name.startswith("java")
        and "kafka.Kafka" in args
        and str(node.properties_file) in args
    )


def _spawn(node: DevNode, command: list[str]) -> int:
    with node.stdout_file.open("wb") as out:
        # Its own session: Ctrl-C in the terminal that ran `pipeline dev up` leaves Kafka alone.
        proc = subprocess.Popen(
            command,
            cwd=node.dir,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _children[proc.pid] = proc
    node.pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_gone(pids: dict[int, DevNode], deadline: float) -> dict[int, DevNode]:
    """Polls until the processes exit or the deadline passes; returns the ones still running."""
    while True:
        # Only liveness here: the command line empties early in an exit, before the sockets close.
        pids = {pid: node for pid, node in pids.items() if _pid_running(pid)}
        if not pids or time.monotonic() >= deadline:
            return pids
        time.sleep(0.1)


def stop_nodes(
    nodes: Sequence[DevNode], *, hard: bool = False, timeout: float = STOP_TIMEOUT_S
) -> list[int]:
    """Stops the nodes' brokers (SIGTERM, or SIGKILL if ``hard`` or after ``timeout``)."""
    running = {pid: node for node in nodes if (pid := node.pid()) is not None}
    _terminate(running, hard=hard, timeout=timeout)
    for node in nodes:  # stale ones too
        node.pid_file.unlink(missing_ok=True)
    return sorted(running)


def _terminate(
    running: dict[int, DevNode], *, hard: bool = False, timeout: float = STOP_TIMEOUT_S
) -> None:
    """Signals processes known to be ours and waits for them (SIGKILL after ``timeout``)."""
    for pid in running:
        # A reaped child's pid may already belong to someone else: signal live ones only.
        if _pid_running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
    left = _wait_gone(running, time.monotonic() + timeout)
    for pid, node in left.items():
        if _is_node_process(pid, node):  # checked again right before the signal
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    left = _wait_gone(left, time.monotonic() + 30)
    if left:
        raise DevBrokerError(f"Kafka processes {sorted(left)} did not exit even after SIGKILL")
    for node in running.values():
        node.pid_file.unlink(missing_ok=True)


def _exited_message(node: DevNode) -> str:
    parts = [f"the Kafka broker of node {node.index} exited during startup."]
    for path in (node.stdout_file, node.log_file):
        if tail := _tail_file(path):
            parts.append(f"Last lines of {path}:\n{tail}")
    parts.append("Fix the cause above; `--fresh` starts over with empty data if it is corrupt.")
    return "\n".join(parts)


# --- Ports -------------------------------------------------------------------------------------


def port_is_free(port: int, address: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``address:port`` now (what Kafka will try)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the JVM's server sockets: a closed connection in TIME_WAIT does not block the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def port_owner(port: int) -> str | None:
    """``pid N (command line)`` of the process listening on ``port``, if this system tells us."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # fields: sl, local "ADDR:PORT" (hex), remote, state (0A = LISTEN), ..., inode (9)
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1][-4:], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in inodes:
                        command = " ".join(_cmdline(int(proc.name)) or ["?"])
                        if len(command) > 160:
                            command = command[:157] + "..."
                        return f"pid {proc.name} ({command})"
    return None


def check_ports_free(nodes: Sequence[DevNode]) -> None:
    """Raises :class:`DevBrokerError` naming the first port of ``nodes`` already in use."""
    for node in nodes:
        broker = "127.0.0.1" if node.host == "localhost" else node.host
        for port, role, address in (
            (node.port, "broker", broker),
            (node.controller_port, "controller", "127.0.0.1"),
        ):
            if port_is_free(port, address):
                continue
            owner = port_owner(port)
            raise PortInUseError(
                f"port {port} (the {role} port of node {node.index}) is already in use by "
                f"{owner or 'another process'}; stop that process, or start on other ports with "
                "--port, e.g. --port 19092. To use a Kafka that is already running, "
                "set PIPELINE_BOOTSTRAP_SERVERS instead.",
                port,
            )


def free_base_port(nodes: int = 1) -> int:
    """A base port whose ``2 * nodes`` consecutive ports are free now, for tests beside 9092."""
    # Below the kernel's ephemeral range, so client connections cannot take the ports meanwhile.
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    top = max(low, 12000) - 2 * nodes
    for _ in range(200):
        base = random.randrange(10000, top)
        if all(port_is_free(p) for p in range(base, base + 2 * nodes)):
            return base
    raise DevBrokerError(f"found no {2 * nodes} consecutive free ports between 10000 and {low}")
