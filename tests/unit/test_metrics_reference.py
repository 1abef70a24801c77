"""docs/metrics.md lists exactly the metrics each process exports, with their types."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.registry import CollectorRegistry

from pipeline._backlog import Backlog, GroupMembers, PartitionBacklog, TopicBacklog
from pipeline._deadletters import DlqStats
from pipeline_cli._exporter import ExporterState
from pipeline_cli._exporter import make_registry as exporter_registry
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._metricsexport import Gauges
from pipeline_worker._metricsexport import make_registry as worker_registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(?P<name>[a-z_]+)` \| (?P<type>\w+) \| [^|]* \| (?P<process>\w+) \|")
PROCESSES = ("worker", "scheduler", "exporter")


def documented() -> dict[str, dict[str, str]]:
    """process -> metric -> type, from the reference table (``all`` rows go to each process)."""
    table: dict[str, dict[str, str]] = {p: {} for p in PROCESSES}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match is None:
            continue
        process = match["process"]
        for target in PROCESSES if process == "all" else (process,):
            assert match["name"] not in table[target], f"{match['name']} listed twice"
            table[target][match["name"]] = match["type"]
    return table


def exported(registry: CollectorRegistry) -> dict[str, str]:
    """Metric name as scraped (counters with ``_total``) -> type."""
    found = {}
    for family in registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        found[name] = family.type
    return found


def gauges() -> Gauges:
    return Gauges(
        in_flight=lambda: 3,
        concurrency=4,
        threads=lambda: 0,
        buffered=lambda: {"default": 1},
        paused=lambda: 0,
        assigned=lambda: 1,
    )


def backlog() -> Backlog:
    topic = TopicBacklog("ns.jobs.default", "ns.workers", (PartitionBacklog(0, 0, 5, 2, 1000),))
    return Backlog(
        read_at=10.0,
        jobs={"default": topic},
        retries=(),
        deferred=(),
        dead_letters=DlqStats({"pending": 1, "replayed": 2, "discarded": 0}, {}, {}, 0),
        groups={"worker": GroupMembers("ns.workers", "EMPTY", ())},
    )


def registries() -> dict[str, CollectorRegistry]:
    state = ExporterState()
    state.backlog = backlog()
    return {
        "worker": worker_registry(WorkerMetrics(), gauges()),
        "scheduler": SchedulerMetrics().registry,
        "exporter": exporter_registry(state),
    }


def test_table_lists_exactly_the_exported_metrics() -> None:
    table = documented()
    for process, registry in registries().items():
        assert exported(registry) == table[process], process


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
