"""Java and the Kafka jars: the Java check, the one-time Maven download, the JVM commands.

The jars come from Maven Central through Maven, once per Kafka version, into a cache dir shared by
every data dir; the broker and ``kafka.tools.StorageTool`` then run on the machine's Java 17+.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ._devprocs import _LOCK_FILE, DevBrokerError, _file_lock, _tail

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._devprocs import DevNode

KAFKA_VERSION = "4.4.0"
SCALA_VERSION = "2.13"
LOG4J_SLF4J_VERSION = "2.24.3"
MIN_JAVA_VERSION = 17
TRANSACTION_VERSION = 2
"""Transactions version 2 (KIP-890): the broker itself closes the hanging-transaction holes; set
at format time so the cluster does not depend on a release's default."""

_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')

Progress = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


def default_cache_dir(version: str = KAFKA_VERSION) -> Path:
    """``$PIPELINE_DEV_CACHE``, else ``$XDG_CACHE_HOME/pipeline/kafka-<version>`` (``~/.cache``)."""
    if env := os.environ.get("PIPELINE_DEV_CACHE"):
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "pipeline" / f"kafka-{version}"


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


def maven_pom(version: str = KAFKA_VERSION, extra: Sequence[str] = ()) -> str:
    """A pom whose runtime dependencies are the broker plus the slf4j binding Kafka 4 omits,
    and the ``extra`` Kafka artifacts (``kafka-tools`` for the command-line tools) of the same
    version."""
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_VERSION}", version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_SLF4J_VERSION),
        *(("org.apache.kafka", artifact, version) for artifact in extra),
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
    version: str = KAFKA_VERSION,
    cache_dir: Path | None = None,
    progress: Progress = _quiet,
    extra: Sequence[str] = (),
) -> Path:
    """The directory of the broker jars (and ``extra`` Kafka artifacts, see :func:`maven_pom`),
    fetched from Maven Central by Maven on first use."""
    cache = (cache_dir or default_cache_dir(version)).expanduser().resolve()
    lib, marker = cache / "lib", cache / ".complete"
    pom = maven_pom(version, extra)
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


# --- The JVM commands --------------------------------------------------------------------------


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


def _format(java: str, lib: Path, nodes: Sequence[DevNode], extra: Sequence[str] = ()) -> str:
    """Formats the nodes' storage (``extra``: more ``format`` arguments, e.g. ``--add-scram``)."""

    def run(*args: str) -> subprocess.Popen[str]:
        command = _tool_command(java, lib, *args)
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    cluster_id = _check_tool(run("random-uuid"), "random-uuid").strip().splitlines()[-1]
    # controller.quorum.voters is set, so a plain format makes a static quorum (no --standalone).
    # The nodes are formatted in parallel: each one is a JVM start of a few seconds.
    feature = f"transaction.version={TRANSACTION_VERSION}"
    procs = [
        run("format", "-t", cluster_id, "-c", str(n.properties_file), "--feature", feature, *extra)
        for n in nodes
    ]
    for proc in procs:
        _check_tool(proc, "format")
    return cluster_id.strip()
