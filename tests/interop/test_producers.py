"""Jobs produced from Java (Avro + kafka-clients) and Go (hamba/avro + franz-go) run in a worker.

Each producer (``tests/interop/java``, ``tests/interop/go``) is built here (Maven and the Go
module cache keep the dependencies; outputs are rebuilt only when a source is newer) and writes
immediate, keyed, idempotency-keyed and delayed jobs with unicode payloads. A real worker and
scheduler run them: every job runs exactly once with its exact payload, keyed jobs land on the
partitions the Python library's ``enqueue`` picks for the same keys, unkeyed ones on every
partition.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pipeline import Pipeline
from tests.builds import build, run_tool, stale

from ..integration.worker.fixtures import kit, schedulers
from ..integration.worker.harness import wait_until

if TYPE_CHECKING:
    from ..integration.scheduler.conftest import SchedulerFactory
    from ..integration.worker.fixtures import WorkerKit

__all__ = ["kit", "schedulers"]

pytestmark = pytest.mark.kafka

HERE = Path(__file__).parent
REPO = HERE.parents[1]
SCHEMA = REPO / "schemas" / "pipeline" / "job.v1.avsc"
COUNTS = {"immediate": 12, "keyed": 8, "idempotent": 8, "delayed": 4}
DELAY_MS = 2000


def _java(servers: str, namespace: str) -> list[dict[str, str]]:
    project = HERE / "java"
    classpath = project / "target" / "classpath.txt"
    sources = [project / "pom.xml", *project.glob("src/**/*.java")]
    if stale(project / "target" / "producer-1.jar", sources) or not classpath.exists():
        run_tool(["mvn", "-q", "-B", "package", "dependency:build-classpath",
                  f"-Dmdep.outputFile={classpath}"], project)  # fmt: skip
    cp = f"{project / 'target' / 'producer-1.jar'}:{classpath.read_text().strip()}"
    counts = [str(COUNTS[k]) for k in ("immediate", "keyed", "idempotent", "delayed")]
    out = run_tool(["java", "-cp", cp, "interop.Producer", servers, namespace, str(SCHEMA),
                *counts, str(DELAY_MS)], REPO)  # fmt: skip
    rows = [line.split("\t") for line in out.splitlines()]
    return [{"id": i, "kind": kind, "key": key, "text": text} for i, kind, key, text in rows]


def _go(servers: str, namespace: str) -> list[dict[str, str]]:
    project = HERE / "go"
    binary = project / "build" / "producer"
    sources = [project / "go.mod", project / "go.sum", *project.rglob("*.go")]
    build(binary, sources, ["go", "build", "-o", str(binary), "."], project)
    flags = [f"-{name}={count}" for name, count in COUNTS.items()]
    command = [str(binary), "-brokers", servers, "-namespace", namespace, "-schema", str(SCHEMA)]
    out = run_tool([*command, *flags, f"-delay={DELAY_MS}ms"], REPO)
    return [json.loads(line) for line in out.splitlines()]


def _runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.parametrize("producer", [_java, _go], ids=["java", "go"])
def test_jobs_from_another_language_run_once_on_the_python_partitions(
    producer: object, kit: WorkerKit, schedulers: SchedulerFactory, tmp_path: Path
) -> None:
    record = tmp_path / "echo.log"
    kit.workers.app = "tests.interop.app:app"
    scheduler = schedulers.start()
    kit.workers.start("--concurrency", "8", env={"INTEROP_RECORD": str(record)})
    assert callable(producer)
    jobs: list[dict[str, str]] = producer(kit.settings.bootstrap_servers, kit.settings.namespace)
    assert len(jobs) == sum(COUNTS.values())
    # The Python library, the same keys: the partitions a Java or Go producer must match.
    python = Pipeline(kit.settings)
    keyed = [job for job in jobs if job["key"] and job["kind"] != "delayed"]
    python_ids = {
        python.enqueue("interop.echo", {"text": "python", "n": 0}, key=job["key"]): job["key"]
        for job in keyed
    }
    python.flush(30)
    python.close(30)
    expected = {job["id"] for job in jobs} | set(python_ids)

    wait_until(
        lambda: {r["id"] for r in _runs(record)} >= expected,
        timeout=60,
        what=lambda: f"every job to run\n{scheduler.output()[-2000:]}",
    )
    runs = _runs(record)
    counts: dict[object, int] = defaultdict(int)
    for run in runs:
        counts[run["id"]] += 1
    assert {i: c for i, c in counts.items() if c != 1} == {}
    by_id = {run["id"]: run for run in runs}
    for job in jobs:
        run = by_id[job["id"]]
        assert run["text"] == job["text"]
        assert run["key"] == (job["key"] or None)
        assert run["headers"]["greeting"] == "Grüße"
    on_python = {python_ids[i]: by_id[i]["partition"] for i in python_ids}
    assert {job["key"]: by_id[job["id"]]["partition"] for job in keyed} == on_python
    unkeyed = {by_id[job["id"]]["partition"] for job in jobs if job["kind"] == "immediate"}
    assert unkeyed == set(range(kit.settings.topics.partitions))
    for job in jobs:
        if job["kind"] == "delayed":
            assert by_id[job["id"]]["topic"] == kit.topics.jobs("high")


def test_the_docs_java_snippet_compiles(tmp_path: Path) -> None:
    text = (REPO / "docs" / "wire-format.md").read_text(encoding="utf-8")
    [snippet] = re.findall(r"```java\n(.*?)```", text, re.S)
    source = tmp_path / "EnqueueWelcomeEmail.java"
    source.write_text(snippet, encoding="utf-8")
    classpath = HERE / "java" / "target" / "classpath.txt"
    if not classpath.exists():
        run_tool(["mvn", "-q", "-B", "dependency:build-classpath",
                  f"-Dmdep.outputFile={classpath}"], HERE / "java")  # fmt: skip
    run_tool(
        ["javac", "-d", str(tmp_path), "-cp", classpath.read_text().strip(), str(source)], REPO
    )
    assert (tmp_path / "EnqueueWelcomeEmail.class").exists()
