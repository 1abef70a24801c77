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


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    try:
        with running_registry(tmp_path_factory.mktemp("registry")) as registry:
            yield registry
    except RuntimeError as exc:
        pytest.fail(f"could not start a schema registry for the tests: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def java_registry_producer() -> list[str]:
    """The command that runs ``RegistryProducer`` (built with Maven when its sources changed)."""
    target = JAVA_PROJECT / "target"
    jar = target / "registry-producer-1.jar"
    classpath = target / "classpath.txt"
    sources = [JAVA_PROJECT / "pom.xml", *JAVA_PROJECT.glob("src/**/*.java")]
    newest = max(path.stat().st_mtime for path in sources)
    if not (jar.is_file() and classpath.is_file() and jar.stat().st_mtime >= newest):
        mvn = shutil.which("mvn")
        assert mvn is not None, "Maven is required (.ci/run checks for it)"
        build = subprocess.run(
            [mvn, "-q", "-B", "package"],
            cwd=JAVA_PROJECT,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert build.returncode == 0, f"the Java producer did not build:\n{build.stdout[-3000:]}"
    java = shutil.which("java")
    assert java is not None
    return [
        java,
        "-cp",
        f"{jar}:{classpath.read_text().strip()}",
        "pipeline.interop.RegistryProducer",
    ]
