"""Prometheus metrics of a scheduler process: its own registry, served by the library's
:class:`pipeline._metricsserver.MetricsServer`."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.registry import CollectorRegistry

from pipeline._metricsserver import add_process_metrics

LATENESS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0, 300.0,
)  # fmt: skip


class SchedulerMetrics:
    """The scheduler's counters, gauges and the release lateness histogram."""

    def __init__(self) -> None:
        self.registry = add_process_metrics(CollectorRegistry())
        r = self.registry
        self.is_leader = Gauge(
            "pipeline_scheduler_is_leader", "1 while this process is the leader", registry=r
        )
        self.held = Gauge(
            "pipeline_scheduler_held_jobs", "Delayed jobs waiting in memory", registry=r
        )
        self.parked = Gauge(
            "pipeline_scheduler_parked_messages",
            "Messages read and not yet routed, their partitions paused: wait-tier messages read "
            "ahead of their time, and those read behind a partition holding all it may",
            registry=r,
        )
        self.releases = Counter(
            "pipeline_scheduler_releases", "Delayed jobs released to a job topic", registry=r
        )
        self.tier_moves = Counter(
            "pipeline_scheduler_tier_moves",
            "Delayed jobs moved to a wait tier",
            ["tier"],
            registry=r,
        )
        self.lateness = Histogram(
            "pipeline_scheduler_release_lateness_seconds",
            "Release time minus planned release time (due time minus the release lead)",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.cron_fires = Counter(
            "pipeline_scheduler_cron_fires", "Cron fires enqueued", ["schedule"], registry=r
        )
        self.transactions = Counter(
            "pipeline_scheduler_transactions", "Transactions committed", registry=r
        )
        self.aborts = Counter(
            "pipeline_scheduler_transaction_aborts", "Transactions aborted", registry=r
        )
        self.schedules_invalid = Gauge(
            "pipeline_scheduler_schedules_invalid",
            "Schedules on <ns>.schedules the leader skips: undecodable, or never firing",
            registry=r,
        )
        self.dead_letters = Counter(
            "pipeline_scheduler_dead_letters",
            "Undecodable deferred messages dead-lettered",
            registry=r,
        )
        self.state_records_skipped = Counter(
            "pipeline_scheduler_state_records_skipped",
            "Records of <ns>.scheduler-state a new leader could not read and skipped",
            registry=r,
        )

    def watch(self, held: Callable[[], float], parked: Callable[[], float]) -> None:
        self.held.set_function(held)
        self.parked.set_function(parked)
