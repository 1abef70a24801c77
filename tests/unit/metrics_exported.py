"""What each process exports on ``/metrics``, read from the registries the processes build.

Shared by the checks of docs/metrics.md, of the alert rules and of the Grafana dashboard, so
that each compares with the same, real, source: the worker's, the scheduler's and the
exporter's registries, built here as the running processes build them.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.registry import CollectorRegistry

from pipeline._backlogmodel import Backlog, GroupMembers, PartitionBacklog, TopicBacklog
from pipeline._deadletters import DlqStats
from pipeline_cli._exporter import ExporterState
from pipeline_cli._exporter import make_registry as exporter_registry
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._metricsexport import Gauges
from pipeline_worker._metricsexport import make_registry as worker_registry

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(
    r"^\| `(?P<name>[a-z_]+)` \| (?P<type>\w+) \| (?P<labels>[^|]*) \| (?P<process>\w+) \|"
)
PROCESSES = ("worker", "scheduler", "exporter")
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
"""The series a histogram ``h`` is scraped as; only ``h_bucket`` has the ``le`` label."""


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


def documented_labels() -> dict[str, frozenset[str]]:
    """metric -> its label names, from the table's labels column (``status (`a`, `b`), group``:
    the values in parentheses are examples, not labels; ``—``: none)."""
    found = {}
    for line in DOC.read_text().splitlines():
        match = ROW.match(line)
        if match is not None:
            text = re.sub(r"\([^)]*\)", "", match["labels"]).strip()
            names = () if text == "—" else (label.strip() for label in text.split(","))
            found[match["name"]] = frozenset(names)
    return found


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
        overdue=lambda: 0,
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
    state.read = (backlog(), True)
    return {
        "worker": worker_registry(WorkerMetrics(), gauges()),
        "scheduler": SchedulerMetrics().registry,
        "exporter": exporter_registry(state),
    }


def busy_registries() -> dict[str, CollectorRegistry]:
    """The registries after each labelled metric counted something, so that every family has
    a sample showing its label names (a labelled family with nothing counted has none)."""
    worker = WorkerMetrics()
    stats = worker.type_stats("email.send", "default")
    stats.started = stats.succeeded = 1
    stats.duration.observe(0.1)
    stats.latency.observe(0.1)
    worker.count(worker.undecodable, "decode_error")
    worker.count_commit("async", ok=True, seconds=0.01)
    worker.count(worker.rebalances, "assign")
    worker.lag[("ns.jobs.default", 0)] = 1
    worker.count_move("email.send", dead=False, reason="retry.0")
    worker.count_move("email.send", dead=True, reason="exhausted")
    worker.count(worker.relayed, "ns.retry.0")
    worker.count_dedup("email.send", "duplicate")
    worker.tenant_stats("acme").wait.observe(0.1)
    scheduler = SchedulerMetrics()
    scheduler.tier_moves.labels(tier="ns.deferred.0").inc()
    scheduler.cron_fires.labels(schedule="nightly").inc()
    tier = TopicBacklog("ns.retry.0", "ns.workers.retry", (PartitionBacklog(0, 0, 1, 0, 1000),))
    deferred = TopicBacklog("ns.deferred", "ns.scheduler", (PartitionBacklog(0, 0, 1, 0, 1000),))
    state = ExporterState()
    full = backlog()
    busy = Backlog(
        read_at=full.read_at,
        jobs=full.jobs,
        retries=(tier,),
        deferred=(deferred,),
        dead_letters=full.dead_letters,
        groups=full.groups,
    )
    state.read = (busy, True)
    return {
        "worker": worker_registry(worker, gauges()),
        "scheduler": scheduler.registry,
        "exporter": exporter_registry(state),
    }


def series_labels() -> dict[str, frozenset[str]]:
    """Every series name a scrape of a worker, a scheduler or an exporter can show (histograms
    as ``_bucket``/``_sum``/``_count``, counters as ``_total``) -> its label names."""
    found: dict[str, set[str]] = {}
    for registry in busy_registries().values():
        for family in registry.collect():
            for sample in family.samples:
                found.setdefault(sample.name, set()).update(sample.labels)
    return {name: frozenset(labels) for name, labels in found.items()}
