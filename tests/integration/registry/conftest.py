"""Fixtures of the schema registry tests: a real registry and the Java producer, built once."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.builds import build

from .apicurio import RunningRegistry, running_registry

if TYPE_CHECKING:
    from collections.abc import Iterator

JAVA_PROJECT = Path(__file__).with_name("java")
GO_PROJECT = Path(__file__).parents[2] / "interop" / "go"


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
    sources = [JAVA_PROJECT / "pom.xml", *JAVA_PROJECT.glob("src/**/*.java")]
    build(jar, sources, ["mvn", "-q", "-B", "package"], JAVA_PROJECT)
    java = shutil.which("java")
    assert java is not None
    classpath = (target / "classpath.txt").read_text().strip()
    return [java, "-cp", f"{jar}:{classpath}", "pipeline.interop.RegistryProducer"]


@pytest.fixture(scope="session")
def go_registry_producer() -> list[str]:
    """The command that runs the Go producer (``registry`` in the interop Go module, which has
    the envelope's Go type; built with Go when its sources changed)."""
    binary = GO_PROJECT / "build" / "registry-producer"
    sources = [GO_PROJECT / "go.mod", GO_PROJECT / "go.sum", *GO_PROJECT.rglob("*.go")]
    build(binary, sources, ["go", "build", "-o", str(binary), "./registry"], GO_PROJECT)
    return [str(binary)]
