"""A real local Apache Kafka (KRaft) for development and tests, without Docker.

The broker jars come from Maven Central through Maven (once; cached afterwards) and run on the
machine's Java 17+. Ports: one node serves clients on ``localhost:9092`` (controller 9093); three
nodes on 9092, 9094, 9096 (controllers 9093, 9095, 9097). ``base_port`` shifts them all: node ``i``
(counted from 0, ``node.id`` ``i + 1``) uses ``base_port + 2*i`` and ``base_port + 2*i + 1``.

A data dir holds ``cluster.json`` (what was formatted) and one ``node-<i>/`` per node with
``node.properties``, ``log4j2.yaml``, ``kafka.pid``, ``server.log``, ``stdout.log`` and ``data/``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline._errors import PipelineError

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
LOG4J_SLF4J_VERSION = "2.24.3"
MIN_JAVA_VERSION = 17
DEFAULT_BASE_PORT = 9092
STOP_TIMEOUT_S = 60.0

_LAYOUT_FILE = "cluster.json"
_LOCK_FILE = ".lock"
_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')
# Children spawned by this process, kept so they are reaped (no zombies, no ResourceWarning).
_children: dict[int, subprocess.Popen[bytes]] = {}

Progress = Callable[[str], None]


class DevBrokerError(PipelineError):
    """The local Kafka could not be started or stopped; the message says why and what to do."""


class PortInUseError(DevBrokerError):
    """A port the cluster needs is taken by another process."""

    def __init__(self, message: str, port: int) -> None:
        super().__init__(message)
        self.port = port


def _quiet(_message: str) -> None:
    pass


def default_data_dir() -> Path:
    """``$PIPELINE_DEV_DIR``, else ``$XDG_STATE_HOME/pipeline/dev``, else ``~/.local/state/...``."""
    if env := os.environ.get("PIPELINE_DEV_DIR"):
        return Path(env).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state) / "pipeline" / "dev"


def default_cache_dir(version: str = KAFKA_VERSION) -> Path:
    """``$PIPELINE_DEV_CACHE``, else ``$XDG_CACHE_HOME/pipeline/kafka-<version>`` (``~/.cache``)."""
    if env := os.environ.get("PIPELINE_DEV_CACHE"):
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "pipeline" / f"kafka-{version}"


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


# --- Java and the jars -------------------------------------------------------------------------


def parse_java_version(text: str) -> int | None:
    """The major version in ``java -version`` output (``1.8.0_392`` is 8, ``17.0.15`` is 17)."""
    match = _JAVA_VERSION.search(text)
    if match is None:
        return None
    major = int(match[1])
    return int(match[2]) if major == 1 and match[2] else major


def find_java() -> str:
    """The ``java`` to run Kafka with (``$JAVA_HOME`` first, then PATH), checked to be 17+."""
    java_home = os.environ.get("JAVA_HOME")
    home_java = Path(java_home, "bin", "java") if java_home else None
    java = str(home_java) if home_java and home_java.is_file() else shutil.which("java")
    install = "install a JDK 17 or newer, e.g. `apt-get install openjdk-17-jre-headless`"
    if java is None:
        raise DevBrokerError(f"no `java` on PATH: Kafka brokers run on Java; {install}")
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DevBrokerError(f"could not run `{java} -version` ({exc}); {install}") from exc
    major = parse_java_version(out.stderr + out.stdout)
    if major is None:
        raise DevBrokerError(
            f"could not read the version of {java} from `java -version` "
            f"({_tail(out.stderr + out.stdout, 3)!r}); {install}"
        )
    if major < MIN_JAVA_VERSION:
        raise DevBrokerError(
            f"{java} is Java {major}, but Kafka {KAFKA_VERSION} brokers need Java "
            f"{MIN_JAVA_VERSION}+; {install}, and put it first on PATH or point JAVA_HOME at it"
        )
    return java


def maven_pom(version: str = KAFKA_VERSION) -> str:
    """A pom whose runtime dependencies are the broker plus the slf4j binding Kafka 4 omits."""
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_VERSION}", version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_SLF4J_VERSION),
    ]
    dependencies = "".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>\n"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>local.pipeline</groupId><artifactId>kafka-dev-broker</artifactId>"
        "<version>1</version>\n"
        f"  <dependencies>\n{dependencies}  </dependencies>\n"
        "  <build><plugins><plugin><groupId>org.apache.maven.plugins</groupId>"
        "<artifactId>maven-dependency-plugin</artifactId><version>3.8.1</version>"
        "</plugin></plugins></build>\n"
        "</project>\n"
    )


def ensure_kafka(
    version: str = KAFKA_VERSION, cache_dir: Path | None = None, progress: Progress = _quiet
) -> Path:
    """The directory of the broker jars, fetched from Maven Central by Maven on first use."""
    cache = (cache_dir or default_cache_dir(version)).expanduser().resolve()
    lib, marker = cache / "lib", cache / ".complete"
    pom = maven_pom(version)
    # The marker holds the pom's hash: a half-finished or outdated download is done again.
    stamp = hashlib.sha256(pom.encode()).hexdigest()

    def complete() -> bool:
        return marker.is_file() and marker.read_text().strip() == stamp

    if complete():
        return lib
    with _file_lock(cache / _LOCK_FILE):
        if complete():  # another process finished the download while we waited
            return lib
        mvn = shutil.which("mvn")
        if mvn is None:
            raise DevBrokerError(
                f"Kafka {version} is not in {cache} yet and `mvn` is not on PATH: Maven fetches "
                "the broker jars from Maven Central once; install Maven (e.g. `apt-get install "
                "maven`) and try again"
            )
        progress(f"Fetching Apache Kafka {version} from Maven Central into {cache} (once)...")
        marker.unlink(missing_ok=True)
        shutil.rmtree(lib, ignore_errors=True)
        (cache / "pom.xml").write_text(pom)
        cmd = [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(cache / "pom.xml")]
        cmd += ["dependency:copy-dependencies", "-DincludeScope=runtime"]
        cmd += [f"-DoutputDirectory={lib}"]
        try:
            proc = subprocess.run(
                cmd, cwd=cache, capture_output=True, text=True, timeout=1800, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise DevBrokerError(
                "Maven did not finish fetching Kafka within 30 minutes; check the network "
                "connection to Maven Central (or the proxy in ~/.m2/settings.xml) and try again"
            ) from exc
        if proc.returncode != 0 or not (lib / f"kafka_{SCALA_VERSION}-{version}.jar").is_file():
            raise DevBrokerError(
                f"Maven could not fetch Kafka {version} (exit code {proc.returncode}); check that "
                "Maven Central is reachable (network, proxy in ~/.m2/settings.xml) and try "
                f"again. Last lines of mvn output:\n{_tail(proc.stdout + proc.stderr)}"
            )
        marker.write_text(stamp + "\n")
    return lib


# --- Nodes, their files and their processes ----------------------------------------------------


@dataclass(frozen=True)
class DevNode:
    """One combined broker+controller node: its ports and the files under its directory."""

    index: int
    port: int
    controller_port: int
    dir: Path

    @property
    def node_id(self) -> int:
        return self.index + 1

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


def plan_nodes(nodes: int, base_port: int, data_dir: Path) -> tuple[DevNode, ...]:
    """The nodes of a cluster: node ``i`` uses ``base_port + 2*i`` and ``base_port + 2*i + 1``."""
    return tuple(
        DevNode(i, base_port + 2 * i, base_port + 2 * i + 1, data_dir / f"node-{i}")
        for i in range(nodes)
    )


def node_properties(node: DevNode, cluster: Sequence[DevNode]) -> dict[str, str]:
    """The broker configuration of ``node`` in ``cluster`` (static KRaft quorum of all nodes)."""
    replicas = min(3, len(cluster))
    min_isr = 2 if replicas >= 3 else 1
    return {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        "controller.quorum.voters": ",".join(
            f"{n.node_id}@localhost:{n.controller_port}" for n in cluster
        ),
        "listeners": f"PLAINTEXT://localhost:{node.port},CONTROLLER://localhost:"
        f"{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://localhost:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(node.data_path),
        "auto.create.topics.enable": "false",
        "group.initial.rebalance.delay.ms": "0",
        "num.partitions": "1",
        "default.replication.factor": str(replicas),
        # Few internal partitions: faster startup and group coordination on a small machine.
        "offsets.topic.num.partitions": "10",
        "offsets.topic.replication.factor": str(replicas),
        "transaction.state.log.num.partitions": "10",
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        # The cleaner's default 128 MB dedupe buffer is a big share of a small dev heap.
        "log.cleaner.dedupe.buffer.size": str(32 * 1024 * 1024),
    }


def _log4j2_yaml(node: DevNode) -> str:
    # json.dumps gives a double-quoted string, which YAML reads as the same string.
    log, pattern = json.dumps(str(node.log_file)), json.dumps(f"{node.log_file}.%i")
    return f"""Configuration:
  name: pipeline-dev-kafka
  Appenders:
    RollingFile:
      name: File
      fileName: {log}
      filePattern: {pattern}
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
      Policies:
        SizeBasedTriggeringPolicy:
          size: "10 MB"
      DefaultRolloverStrategy:
        max: 2
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        ref: File
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: INFO
      - name: kafka.request.logger
        level: WARN
      - name: state.change.logger
        level: WARN
"""


def _write_node_files(node: DevNode, cluster: Sequence[DevNode]) -> None:
    node.dir.mkdir(parents=True, exist_ok=True)
    props = node_properties(node, cluster)
    # Backslash is the only escape a value can need here (keys are fixed, values are paths/ports).
    text = "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items())
    node.properties_file.write_text(text)
    node.log4j_file.write_text(_log4j2_yaml(node))


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
        del _children[pid]  # reaped: the pid may now belong to anyone
        return False
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


def _java_command(java: str, heap: str, lib: Path, node: DevNode) -> list[str]:
    return [
        java,
        f"-Xmx{heap}",
        f"-Xms{heap}",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={node.log4j_file}",
        "-cp",
        f"{lib}/*",
        "kafka.Kafka",
        str(node.properties_file),
    ]


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


# --- Ports -------------------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``localhost:port`` now (what Kafka will try)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the JVM's server sockets: a closed connection in TIME_WAIT does not block the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
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
        for port, role in ((node.port, "broker"), (node.controller_port, "controller")):
            if port_is_free(port):
                continue
            owner = port_owner(port)
            raise PortInUseError(
                f"port {port} (the {role} port of node {node.index}) is already in use by "
                f"{owner or 'another process'}; stop that process, or start on other ports with "
                "--port (base_port), e.g. --port 19092. To use a Kafka that is already running, "
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


# --- Clusters ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStatus:
    """What ``pipeline dev status`` shows for one node."""

    index: int
    node_id: int
    pid: int | None
    alive: bool
    port: int
    controller_port: int
    log_file: Path


@dataclass(frozen=True)
class ClusterStatus:
    """The nodes formatted in a data dir and whether each one runs."""

    data_dir: Path
    nodes: tuple[NodeStatus, ...]

    @property
    def running(self) -> bool:
        return bool(self.nodes) and all(n.alive for n in self.nodes)

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"localhost:{n.port}" for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        nodes = [
            {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(n).items()}
            for n in self.nodes
        ]
        return {
            "data_dir": str(self.data_dir),
            "bootstrap_servers": self.bootstrap_servers,
            "running": self.running,
            "nodes": nodes,
        }


@dataclass
class DevCluster:
    """A local Kafka cluster started by :func:`up`, with hooks for fault-injection tests."""

    data_dir: Path
    nodes: tuple[DevNode, ...]
    cluster_id: str
    heap: str
    cache_dir: Path | None = None
    already_running: bool = False

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"localhost:{n.port}" for n in self.nodes)

    def status(self) -> ClusterStatus:
        return status(self.data_dir)

    def down(self, *, purge: bool = False) -> list[int]:
        """Stops every node (see :func:`down`)."""
        return down(self.data_dir, purge=purge)

    def stop_node(self, index: int, hard: bool = False, *, timeout: float = STOP_TIMEOUT_S) -> int:
        """Stops node ``index`` (SIGTERM: clean shutdown; ``hard``: SIGKILL, a crash)."""
        node = self.nodes[index]
        stopped = stop_nodes([node], hard=hard, timeout=timeout)
        if not stopped:
            raise DevBrokerError(f"node {index} of {self.data_dir} is not running")
        return stopped[0]

    def start_node(self, index: int, *, timeout: float = 120.0) -> int:
        """Restarts node ``index`` on its data and waits until it is back in the metadata."""
        node = self.nodes[index]
        pid = node.pid()
        return pid if pid is not None else self._start([node], timeout)[0]

    def _start(self, nodes: Sequence[DevNode], timeout: float) -> list[int]:
        check_ports_free(nodes)
        java, lib = find_java(), ensure_kafka(cache_dir=self.cache_dir)
        started = {node: _spawn(node, _java_command(java, self.heap, lib, node)) for node in nodes}
        try:
            self._wait_ready(started, time.monotonic() + timeout, timeout)
        except BaseException:
            # Nothing half-started is left behind. These are our own children, known by pid.
            _terminate({pid: node for node, pid in started.items()}, hard=True)
            raise
        return list(started.values())

    def _wait_ready(self, started: dict[DevNode, int], deadline: float, timeout: float) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        # Each started broker is asked itself, by a new client that knows no other broker: the
        # cluster may list a killed predecessor until its session expires. log_level 0: refused
        # connections while the JVMs boot are expected, not worth printing.
        def ask(node: DevNode) -> Any:
            admin = AdminClient({"bootstrap.servers": f"localhost:{node.port}", "log_level": 0})
            return admin.list_topics(timeout=2)

        waiting = list(started)
        # Nodes stopped on purpose (stop_node) are not waited for.
        wanted = {n.node_id for n in self.nodes if n in started or n.pid() is not None}
        problem = "no answer yet"
        while True:
            for node, pid in started.items():
                # Not node.pid(): a command line reads empty for a moment while exec completes.
                if not _pid_running(pid):
                    raise DevBrokerError(_exited_message(node))
            while waiting:
                node = waiting[0]
                try:
                    metadata = ask(node)
                except KafkaException as exc:
                    problem = f"node {node.index}: {exc.args[0] if exc.args else exc}"
                    break
                seen = set(metadata.brokers)
                if metadata.orig_broker_id != node.node_id or not wanted <= seen:
                    problem = f"node {node.index} sees brokers {sorted(seen)} of {sorted(wanted)}"
                    break
                waiting.pop(0)
            if not waiting:
                return
            if time.monotonic() >= deadline:
                logs = ", ".join(str(n.log_file) for n in started)
                raise DevBrokerError(
                    f"Kafka at {self.bootstrap_servers} did not answer metadata requests with "
                    f"all {len(wanted)} broker(s) within {timeout:.0f}s ({problem}); see {logs}. "
                    "A slow machine may need a longer --timeout."
                )
            time.sleep(0.2)


def _exited_message(node: DevNode) -> str:
    parts = [f"the Kafka broker of node {node.index} exited during startup."]
    for path in (node.stdout_file, node.log_file):
        if tail := _tail_file(path):
            parts.append(f"Last lines of {path}:\n{tail}")
    parts.append("Fix the cause above; `--fresh` starts over with empty data if it is corrupt.")
    return "\n".join(parts)


@dataclass(frozen=True)
class _Layout:
    nodes: int
    base_port: int
    cluster_id: str
    heap: str
    kafka_version: str


def _read_layout(data_dir: Path) -> _Layout | None:
    try:
        return _Layout(**json.loads((data_dir / _LAYOUT_FILE).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise DevBrokerError(
            f"{data_dir / _LAYOUT_FILE} is unreadable ({exc}); start over with --fresh"
        ) from exc


def _check_ours(data_dir: Path) -> None:
    """Refuses to delete a directory that holds anything this module did not create."""
    foreign = [
        p.name
        for p in data_dir.iterdir()
        if p.name not in (_LAYOUT_FILE, _LOCK_FILE) and not p.name.startswith("node-")
    ]
    if foreign:
        raise DevBrokerError(
            f"{data_dir} is not a pipeline dev data dir (it holds {', '.join(sorted(foreign))}); "
            "refusing to use or delete it: choose another --data-dir"
        )


def _wipe(data_dir: Path) -> None:
    _check_ours(data_dir)
    for path in data_dir.iterdir():
        if path.name != _LOCK_FILE:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()


def _tool_command(java: str, lib: Path, *args: str) -> list[str]:
    # C1 only: these short-lived JVMs start faster and never run long enough to need C2.
    return [java, "-XX:TieredStopAtLevel=1", "-cp", f"{lib}/*", "kafka.tools.StorageTool", *args]


def _check_tool(proc: subprocess.Popen[str], what: str) -> str:
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    if proc.returncode != 0:
        raise DevBrokerError(
            f"kafka.tools.StorageTool {what} failed (exit code {proc.returncode}):\n{_tail(out)}"
        )
    return out


def _format(java: str, lib: Path, nodes: Sequence[DevNode]) -> str:
    def run(*args: str) -> subprocess.Popen[str]:
        command = _tool_command(java, lib, *args)
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    cluster_id = _check_tool(run("random-uuid"), "random-uuid").strip().splitlines()[-1]
    # controller.quorum.voters is set, so a plain format makes a static quorum (no --standalone).
    # The nodes are formatted in parallel: each one is a JVM start of a few seconds.
    procs = [run("format", "-t", cluster_id, "-c", str(n.properties_file)) for n in nodes]
    for proc in procs:
        _check_tool(proc, "format")
    return cluster_id.strip()


def up(
    nodes: int | None = None,
    data_dir: Path | None = None,
    base_port: int | None = None,
    heap: str | None = None,
    timeout: float = 120.0,
    *,
    fresh: bool = False,
    cache_dir: Path | None = None,
    progress: Progress = _quiet,
) -> DevCluster:
    """Starts (or restarts on its data, or reports) the local cluster and waits until it serves.

    ``nodes`` and ``base_port`` default to what ``data_dir`` was formatted with, else 1 and 9092;
    ``fresh`` deletes existing data first. ``timeout`` does not count the one-time download.
    """
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(data_dir / _LOCK_FILE):
        layout = _read_layout(data_dir)
        if fresh:
            if layout is not None:
                stop_nodes(plan_nodes(layout.nodes, layout.base_port, data_dir))
            _wipe(data_dir)
            layout = None
        if layout is not None and (
            (nodes is not None and nodes != layout.nodes)
            or (base_port is not None and base_port != layout.base_port)
        ):
            raise DevBrokerError(
                f"{data_dir} holds a {layout.nodes}-node cluster on port {layout.base_port}; "
                f"start it with --nodes {layout.nodes} --port {layout.base_port}, use another "
                "--data-dir, or add --fresh to delete its data"
            )
        count = layout.nodes if layout else nodes or 1
        port = layout.base_port if layout else base_port or DEFAULT_BASE_PORT
        if count < 1 or not 1024 <= port <= 65536 - 2 * count:
            raise DevBrokerError(f"cannot place {count} node(s) from port {port}")
        planned = plan_nodes(count, port, data_dir)
        stopped = [node for node in planned if node.pid() is None]
        if layout is not None and not stopped:
            return DevCluster(data_dir, planned, layout.cluster_id, layout.heap, cache_dir, True)
        check_ports_free(stopped)
        java = find_java()
        lib = ensure_kafka(cache_dir=cache_dir, progress=progress)
        chosen_heap = heap or (layout.heap if layout else "1G" if count == 1 else "512m")
        if layout is None:
            _wipe(data_dir)  # leftovers of a format that failed half-way
        for node in planned:  # rewritten each start, so fixes to the defaults reach old data
            _write_node_files(node, planned)
        if layout is None:
            progress(f"Formatting {count} KRaft node(s) in {data_dir}...")
            cluster_id = _format(java, lib, planned)
            layout = _Layout(count, port, cluster_id, chosen_heap, KAFKA_VERSION)
            (data_dir / _LAYOUT_FILE).write_text(json.dumps(dataclasses.asdict(layout), indent=2))
        cluster = DevCluster(data_dir, planned, layout.cluster_id, chosen_heap, cache_dir)
        progress(f"Starting {len(stopped)} Kafka {KAFKA_VERSION} node(s)...")
        cluster._start(stopped, timeout)
        return cluster


def down(
    data_dir: Path | None = None, *, purge: bool = False, timeout: float = STOP_TIMEOUT_S
) -> list[int]:
    """Stops the brokers started in ``data_dir`` (only those) and returns their pids.

    ``purge`` also deletes the data dir, if it holds nothing but what :func:`up` created.
    """
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    if not data_dir.is_dir():
        return []
    with _file_lock(data_dir / _LOCK_FILE):
        layout = _read_layout(data_dir)
        stopped: list[int] = []
        if layout is not None:
            planned = plan_nodes(layout.nodes, layout.base_port, data_dir)
            stopped = stop_nodes(planned, timeout=timeout)
        if purge:
            _check_ours(data_dir)
            shutil.rmtree(data_dir)
        return stopped


def status(data_dir: Path | None = None) -> ClusterStatus:
    """Each node of the cluster in ``data_dir``: pid, whether it runs, ports and log file."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    layout = _read_layout(data_dir) if data_dir.is_dir() else None
    if layout is None:
        return ClusterStatus(data_dir, ())
    rows = []
    for node in plan_nodes(layout.nodes, layout.base_port, data_dir):
        pid = node.pid()
        rows.append(
            NodeStatus(
                node.index,
                node.node_id,
                pid,
                pid is not None,
                node.port,
                node.controller_port,
                node.log_file,
            )
        )
    return ClusterStatus(data_dir, tuple(rows))
