"""docs/metrics.md lists exactly the metrics each process exports, with their types."""

from __future__ import annotations

from pipeline_cli._exporter import ExporterState
from pipeline_cli._exporter import make_registry as exporter_registry
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._metricsexport import make_registry as worker_registry
from tests.unit.metrics_exported import (
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
    state.backlog = backlog()
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
