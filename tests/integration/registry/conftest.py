"""Fixtures of the schema registry tests: a real registry and the Java producer, built once."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from .apicurio import RunningRegistry, running_registry

if TYPE_CHECKING:
    from collections.abc import Iterator

JAVA_PROJECT = Path(__file__).with_name("java")
GO_PROJECT = Path(__file__).with_name("go")


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    try:
        with running_registry(tmp_path_factory.mktemp("registry")) as registry:
            yield registry
    except RuntimeError as exc:
        pytest.fail(f"could not start a schema registry for the tests: {exc}", pytrace=False)


def _build(project: Path, sources: list[Path], output: Path, command: list[str]) -> None:
    """Runs ``command`` in ``project`` unless ``output`` is newer than every source."""
    newest = max(path.stat().st_mtime for path in sources)
    if output.is_file() and output.stat().st_mtime >= newest:
        return
    tool = shutil.which(command[0])
    assert tool is not None, f"{command[0]} is required (.ci/run checks for it)"
    build = subprocess.run(
        [tool, *command[1:]],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert build.returncode == 0, (
        f"{project.name} did not build:\n{(build.stdout + build.stderr)[-3000:]}"
    )


@pytest.fixture(scope="session")
def java_registry_producer() -> list[str]:
    """The command that runs ``RegistryProducer`` (built with Maven when its sources changed)."""
    target = JAVA_PROJECT / "target"
    jar = target / "registry-producer-1.jar"
    sources = [JAVA_PROJECT / "pom.xml", *JAVA_PROJECT.glob("src/**/*.java")]
    _build(JAVA_PROJECT, sources, jar, ["mvn", "-q", "-B", "package"])
    java = shutil.which("java")
    assert java is not None
    classpath = (target / "classpath.txt").read_text().strip()
    return [java, "-cp", f"{jar}:{classpath}", "pipeline.interop.RegistryProducer"]


@pytest.fixture(scope="session")
def go_registry_producer() -> list[str]:
    """The command that runs the Go producer (built with Go when its sources changed)."""
    binary = GO_PROJECT / "target" / "registry-producer"
    sources = [GO_PROJECT / "go.mod", GO_PROJECT / "go.sum", *GO_PROJECT.glob("*.go")]
    _build(GO_PROJECT, sources, binary, ["go", "build", "-o", str(binary), "."])
    return [str(binary)]
