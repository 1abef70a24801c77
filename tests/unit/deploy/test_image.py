"""The Dockerfile, checked without a container engine: its shape, and its build and run steps
executed as written in a fresh virtualenv, which is what the image's RUN steps do inside
python:3.11-slim. tests/containers/ builds the image itself on Podman and runs it."""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from . import dockerfile
from .k8s_checks import containers
from .tools import K8S, OVERLAYS, ROOT, compose_config, render, run

DOCKERFILE = ROOT / "Dockerfile"
VENV = "/opt/pipeline"  # where the Dockerfile puts the virtualenv


def _scripts() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def test_a_slim_python_311_two_stages_and_a_non_root_user() -> None:
    _, stages = dockerfile.parse(DOCKERFILE)
    assert [stage.base for stage in stages] == ["python:3.11-slim", "python:3.11-slim"]
    runtime = stages[-1]
    (user,) = runtime.all("USER")
    assert user.split(":")[0] not in {"0", "root"}
    assert any(f"--from={stages[0].name}" in args for args in runtime.all("COPY"))
    (cmd,) = runtime.all("CMD")
    assert dockerfile.exec_form(cmd)[0] in _scripts()
    assert runtime.all("ENTRYPOINT") == []  # the command names the console script itself


def test_the_build_context_leaves_venvs_caches_and_broker_data_out() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", "**/__pycache__", ".pipeline", ".mypy_cache", ".pytest_cache"} <= ignored
    assert {".git", "tests"} <= ignored
    _, stages = dockerfile.parse(DOCKERFILE)
    for stage in stages:
        for sources, _ in dockerfile.copies(stage):
            for source in sources:
                assert source.rstrip("/") not in ignored, f"COPY {source} is ignored"


def _commands() -> list[list[str]]:
    """Every command the compose file and the manifests run in the image."""
    services = compose_config(ROOT / "docker-compose.yml")["services"]
    found = [s["command"] for s in services.values() if s.get("image") == "kafka-pipeline:dev"]
    for overlay in OVERLAYS:
        found += [c["command"] for _, c in containers(render(K8S / "overlays" / overlay))]
    unique: list[list[str]] = []
    for command in found:
        if command not in unique:
            unique.append(command)
    return unique


def _runtime_app(runtime: dockerfile.Stage, app: Path) -> None:
    """The image's working directory: what the runtime stage copies in."""
    for sources, destination in dockerfile.copies(runtime):
        (app / destination).mkdir(parents=True, exist_ok=True)
        for source in sources:
            shutil.copy2(ROOT / source, app / destination)


def test_the_image_exposes_every_port_the_stack_serves_on() -> None:
    """EXPOSE lists each metrics port the compose file and the manifests serve (what
    `docker run -P` publishes, and what the Dockerfile's comment promises)."""
    _, stages = dockerfile.parse(DOCKERFILE)
    exposed = {
        int(port.split("/")[0]) for args in stages[-1].all("EXPOSE") for port in args.split()
    }
    services = compose_config(ROOT / "docker-compose.yml")["services"]
    served = {
        int(str(port).split("/")[0])
        for service in services.values()
        if service.get("image") == "kafka-pipeline:dev"
        for port in service.get("expose", [])
    }
    for overlay in OVERLAYS:
        served |= {
            port["containerPort"]
            for _, container in containers(render(K8S / "overlays" / overlay))
            for port in container.get("ports", [])
        }
    assert served >= {8000, 8001, 8002}
    assert served <= exposed, f"not exposed: {sorted(served - exposed)}"


def _run_the_commands(runtime: dockerfile.Stage, bin_dir: Path, app: Path) -> None:
    """The image's CMD and every command compose and Kubernetes run, with --help, and the
    demo app's import, from the image's working directory."""
    (cmd,) = runtime.all("CMD")
    commands = [dockerfile.exec_form(cmd), *_commands()]
    assert {command[0] for command in commands} == _scripts()
    for command in commands:
        help_text = run([str(bin_dir / command[0]), *command[1:], "--help"], cwd=app)
        assert "Usage:" in help_text
    loaded = run(
        [
            str(bin_dir / "python"),
            "-c",
            "from pipeline._loader import load_app; print(type(load_app('examples.app')).__name__)",
        ],
        cwd=app,
    )
    assert loaded.strip() == "Pipeline"


def test_the_commands_run_from_the_images_working_directory(tmp_path: Path) -> None:
    """The quick smoke of the image test below, with the development virtualenv."""
    _, (_, runtime) = dockerfile.parse(DOCKERFILE)
    _runtime_app(runtime, tmp_path)
    _run_the_commands(runtime, Path(sys.executable).parent, tmp_path)


@pytest.mark.image
def test_the_images_steps_run_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """The build stage's COPY and RUN steps as written (a fresh virtualenv where the image
    has /opt/pipeline), then the commands, with nothing of the development setup."""
    _, (build, runtime) = dockerfile.parse(DOCKERFILE)
    context = tmp_path / "src"
    context.mkdir()
    for sources, destination in dockerfile.copies(build):
        for source in sources:
            # Docker's COPY: a directory's contents go into the destination directory.
            if (ROOT / source).is_dir():
                shutil.copytree(
                    ROOT / source,
                    context / destination,
                    ignore=shutil.ignore_patterns("__pycache__"),
                    dirs_exist_ok=True,
                )
            else:
                shutil.copy2(ROOT / source, context / destination)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    for step in build.all("RUN"):
        # The image's `python` is 3.11; here the interpreter running the tests stands in.
        here = step.replace(VENV, str(venv)).replace("python -m venv", f"{sys.executable} -m venv")
        run(["bash", "-euc", here], timeout=600, cwd=context, env=env)
    app = tmp_path / "app"
    _runtime_app(runtime, app)
    _run_the_commands(runtime, venv / "bin", app)
