"""docs/metrics.md lists exactly the metrics each process exports, with their types."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pipeline_cli._exporter import ExporterState
from pipeline_cli._exporter import make_registry as exporter_registry
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._metricsexport import make_registry as worker_registry
from tests.unit.metrics_exported import (
    DOC,
    ROW,
    backlog,
    documented,
    documented_labels,
    exported,
    gauges,
    registries,
    series_labels,
)


def test_table_lists_exactly_the_exported_metrics() -> None:
    table = documented()
    for process, registry in registries().items():
        assert exported(registry) == table[process], process


def test_table_lists_the_labels_of_each_metric() -> None:
    series = series_labels()
    types = {name: kind for table in documented().values() for name, kind in table.items()}
    for name, labels in documented_labels().items():
        scraped = f"{name}_bucket" if types[name] == "histogram" else name
        assert scraped in series, name
        assert series[scraped] - {"le"} == labels, name


def test_every_process_exports_the_process_collector() -> None:
    for process, registry in registries().items():
        names = exported(registry)
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes"):
            assert name in names, f"{process} lacks {name}"
        assert "process_open_fds" in names, process


def test_utilization_is_busy_slots_over_concurrency() -> None:
    registry = worker_registry(WorkerMetrics(), gauges())
    assert registry.get_sample_value("pipeline_worker_utilization_ratio") == 0.75


def test_exporter_serves_depth_and_age_of_the_last_read() -> None:
    state = ExporterState()
    state.read = (backlog(), True)
    state.ok = True  # the last read succeeded: the ages count up to now
    registry = exporter_registry(state)
    assert registry.get_sample_value("pipeline_queue_depth", {"priority": "default"}) == 3
    age = registry.get_sample_value(
        "pipeline_queue_oldest_job_age_seconds", {"priority": "default"}
    )
    assert age is not None
    assert age > 1e9  # the oldest job was written at 1 s after the epoch
    assert registry.get_sample_value("pipeline_dead_letters_pending") == 1
    retained = registry.get_sample_value("pipeline_dead_letters_retained", {"status": "replayed"})
    assert retained == 2


WORKER_SOURCES = Path(__file__).resolve().parents[2] / "services" / "worker" / "pipeline_worker"


def documented_values(metric: str, label: str) -> set[str]:
    """The values the reference table lists for ``label`` of ``metric``: ``mode (`a`, `b`)``."""
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match is not None and match["name"] == metric:
            found = re.search(rf"\b{label} \(([^)]*)\)", match["labels"])
            assert found is not None, f"{metric}: no values listed for {label}"
            return set(re.findall(r"`([^`]+)`", found[1]))
    raise AssertionError(f"{metric} is not in the table")


def test_commit_modes_are_the_ones_the_worker_counts() -> None:
    """Every ``mode`` the worker counts a commit under (the first argument of each
    ``count_commit`` call) is listed, and nothing else: a query on the listed modes sees every
    commit."""
    modes = set()
    for path in WORKER_SOURCES.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "count_commit"
            ):
                (first, *_) = node.args
                assert isinstance(first, ast.Constant), f"{path}: a mode that is not a literal"
                modes.add(first.value)
    assert len(modes) >= 2
    assert documented_values("pipeline_commits_total", "mode") == modes
