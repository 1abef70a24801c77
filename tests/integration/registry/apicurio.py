"""A real schema registry for the tests: Apicurio Registry, from its distribution on Maven Central.

Apicurio serves the Confluent Schema Registry API under ``/apis/ccompat/v7`` (what this
library's client talks to) next to its own under ``/apis/registry/v2`` (what Apicurio's Java
serializer talks to), with in-memory storage. The distribution is fetched once by Maven into
``$XDG_CACHE_HOME/pipeline`` (``~/.cache``) and runs on the machine's Java 17; it gets SIGKILL
when the thread that started it dies, so a killed test run leaves no registry behind.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ops.webproc import die_with_parent

from tests.waiting import wait_for

APICURIO_VERSION = "2.6.13.Final"
_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
_RUNNER = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RunningRegistry:
    base: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def ccompat_url(self) -> str:
        """The Confluent-compatible API: what ``schema_registry.url`` points at."""
        return f"{self.base}/apis/ccompat/v7"

    @property
    def native_url(self) -> str:
        """Apicurio's own API: what Apicurio's serializers point at."""
        return f"{self.base}/apis/registry/v2"


def distribution(cache_dir: Path | None = None) -> Path:
    """The unpacked distribution (fetched by Maven the first time)."""
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home = cache / "pipeline" / f"apicurio-registry-{APICURIO_VERSION}"
    if (home / _RUNNER).is_file():
        return home
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("no `mvn` on PATH: the registry tests fetch Apicurio with Maven")
    with tempfile.TemporaryDirectory(dir=cache) as scratch:
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
                f"-Dartifact={_ARTIFACT}",
                f"-DoutputDirectory={scratch}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"Maven could not fetch {_ARTIFACT}: {result.stdout[-2000:]}")
        (archive,) = Path(scratch).glob("*.tar.gz")
        unpacked = Path(scratch, "unpacked")
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        home.parent.mkdir(parents=True, exist_ok=True)
        if not (home / _RUNNER).is_file():
            unpacked.rename(home)
    return home


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def running_registry(log_dir: Path) -> Iterator[RunningRegistry]:
    """Apicurio on a free 127.0.0.1 port until the block ends; fails with its log if it won't."""
    home = distribution()
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("no `java` on PATH: Apicurio Registry runs on Java 17")
    port = _free_port()
    log = log_dir / "apicurio.log"
    env = {**os.environ, "QUARKUS_HTTP_HOST": "127.0.0.1", "QUARKUS_HTTP_PORT": str(port)}
    with log.open("wb") as out:
        process = subprocess.Popen(
            [java, "-Xmx512m", "-jar", str(home / _RUNNER)],
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent(),  # noqa: PLW1509 - only prctl, resolved before fork
        )
    registry = RunningRegistry(f"http://127.0.0.1:{port}", process, log)
    try:
        subjects = f"{registry.ccompat_url}/subjects"
        # Until it answers, or has exited (then waiting longer is pointless).
        wait_for(lambda: process.poll() is not None or _answers(subjects), START_TIMEOUT_S, 0.2)
        if not _answers(subjects):
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"Apicurio Registry did not start on port {port}:\n{tail}")
        yield registry
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
