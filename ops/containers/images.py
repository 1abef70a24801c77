"""The images docker-compose.yml runs, built from what a machine without Docker Hub can reach.

- the base: Debian's minimal system with Python 3.11, made by ``debootstrap`` from Debian's
  mirror and imported into Podman (``python:3.11-slim`` is the same Debian and the same Python);
  the machine's own extra CA certificates go into it, so builds behind a TLS-inspecting proxy
  reach PyPI and Debian as the machine does;
- Kafka: the Maven Central jars of the version the dev broker runs, on that base with Debian's
  Java 17 (``kafka/``);
- Prometheus: Debian's package (``prometheus/``);
- the project's image: the top-level Dockerfile as it is, with the base as ``PYTHON_IMAGE``.

Each build is skipped when its image is current: the base carries a hash of its recipe as a
label, the other three are layer-cached by Podman.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline_cli._devjars import KAFKA_VERSION, default_cache_dir, ensure_kafka

from .engine import ROOT, EngineError, Podman, run

if TYPE_CHECKING:
    from collections.abc import Callable

HERE = Path(__file__).resolve().parent

BASE = "localhost/pipeline-stand-in/python:3.11"
KAFKA = f"localhost/pipeline-stand-in/kafka:{KAFKA_VERSION}"
PROMETHEUS = "localhost/pipeline-stand-in/prometheus:debian"
PROJECT = "localhost/kafka-pipeline:dev"
"""docker-compose.yml's ``image: kafka-pipeline:dev``, as Podman names a local image."""

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-venv", "python-is-python3", "ca-certificates", "passwd")
EXTRA_CAS = Path("/usr/local/share/ca-certificates")
"""Where Debian keeps a machine's own CA certificates (``update-ca-certificates`` reads it)."""

_RECIPE_LABEL = "org.kafka-pipeline.stand-in.recipe"
_BUILD_TIMEOUT_S = 1800.0


def _recipe() -> str:
    parts = [SUITE, MIRROR, *PACKAGES]
    if EXTRA_CAS.is_dir():
        for cert in sorted(EXTRA_CAS.rglob("*.crt")):
            parts.append(cert.read_text(errors="replace"))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def build_base(podman: Podman, say: Callable[[str], None]) -> None:
    recipe = _recipe()
    if podman.label(BASE, _RECIPE_LABEL) == recipe:
        return
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise EngineError("no `debootstrap` on PATH (`apt-get install debootstrap`)")
    say(f"Building {BASE} with debootstrap from {MIRROR} (about two minutes)...")
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="pipeline-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        command = [debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}"]
        run([*command, SUITE, str(rootfs), MIRROR], env, _BUILD_TIMEOUT_S)
        if EXTRA_CAS.is_dir():
            shutil.copytree(EXTRA_CAS, rootfs / EXTRA_CAS.relative_to("/"), dirs_exist_ok=True)
            run(["chroot", str(rootfs), "update-ca-certificates"], env, _BUILD_TIMEOUT_S)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            assert tar.stdout is not None
            podman.run(
                "import",
                "--change", f"LABEL {_RECIPE_LABEL}={recipe}",
                "--change", "ENV LANG=C.UTF-8",
                "--change", 'CMD ["python3"]',
                "-", BASE,
                timeout=_BUILD_TIMEOUT_S,
                stdin=tar.stdout.fileno(),
            )  # fmt: skip
        if tar.returncode != 0:
            raise EngineError(f"tar of the debootstrap root failed (exit code {tar.returncode})")


def build_kafka(podman: Podman, say: Callable[[str], None]) -> None:
    cache = default_cache_dir().with_name(f"kafka-{KAFKA_VERSION}-tools")
    libs = ensure_kafka(cache_dir=cache, progress=say, extra=("kafka-tools",))
    say(f"Building {KAFKA}...")
    with tempfile.TemporaryDirectory(prefix="pipeline-kafka-image-") as tmp:
        context = Path(tmp)
        shutil.copytree(HERE / "kafka", context, dirs_exist_ok=True)
        shutil.copytree(libs, context / "libs")
        _build(podman, KAFKA, context / "Containerfile", context, f"BASE_IMAGE={BASE}")


def build_prometheus(podman: Podman, say: Callable[[str], None]) -> None:
    say(f"Building {PROMETHEUS}...")
    context = HERE / "prometheus"
    _build(podman, PROMETHEUS, context / "Containerfile", context, f"BASE_IMAGE={BASE}")


def build_project(podman: Podman, say: Callable[[str], None]) -> None:
    say(f"Building {PROJECT} from the Dockerfile...")
    _build(podman, PROJECT, ROOT / "Dockerfile", ROOT, f"PYTHON_IMAGE={BASE}")


def build_all(podman: Podman, say: Callable[[str], None]) -> None:
    """Every image docker-compose.yml with the stand-ins runs (Grafana aside)."""
    build_base(podman, say)
    build_kafka(podman, say)
    build_prometheus(podman, say)
    build_project(podman, say)


def _build(podman: Podman, tag: str, file: Path, context: Path, arg: str) -> None:
    podman.run(
        "build", "--build-arg", arg, "--tag", tag, "--file", str(file), str(context),
        timeout=_BUILD_TIMEOUT_S,
    )  # fmt: skip
