"""The worker's ``/metrics``: :class:`WorkerMetrics` counts and live :class:`Gauges` (in flight,
buffered, utilization) turned into Prometheus metric families at scrape time, plus the process
collector. Every name is listed in docs/metrics.md."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from pipeline._metricsserver import add_process_metrics

from ._metrics import DURATION_BUCKETS, LATENCY_BUCKETS, Histogram, TypeStats, WorkerMetrics


@dataclass(frozen=True)
class Gauges:
    """Live values read at scrape time."""

    in_flight: Callable[[], int]
    concurrency: int
    threads: Callable[[], int]
    """Pool threads started so far for plain-function handlers."""
    overdue: Callable[[], int]
    """Pool threads still inside a job past its time limit."""
    buffered: Callable[[], Mapping[str, int]]
    """Jobs taken from Kafka and not started, by priority."""
    paused: Callable[[], int]
    assigned: Callable[[], int]


class WorkerCollector(Collector):
    """Turns :class:`WorkerMetrics` and :class:`Gauges` into Prometheus metric families."""

    def __init__(self, metrics: WorkerMetrics, gauges: Gauges) -> None:
        self._m = metrics
        self._g = gauges

    def collect(self) -> Iterator[Metric]:
        m = self._m
        stats = list(m.stats.values())
        labels = ["type", "priority"]
        families = {
            "started": CounterMetricFamily(
                "pipeline_jobs_started", "Jobs whose handler was called.", labels=labels
            ),
            "succeeded": CounterMetricFamily(
                "pipeline_jobs_succeeded", "Jobs whose handler returned.", labels=labels
            ),
            "failed": CounterMetricFamily(
                "pipeline_jobs_failed",
                "Jobs whose handler raised or timed out (timeouts included).",
                labels=labels,
            ),
            "timed_out": CounterMetricFamily(
                "pipeline_jobs_timed_out", "Jobs stopped by their time limit.", labels=labels
            ),
        }
        for s in stats:
            values = [s.job_type, s.priority]
            families["started"].add_metric(values, s.started)
            families["succeeded"].add_metric(values, s.succeeded)
            families["failed"].add_metric(values, s.failed)
            families["timed_out"].add_metric(values, s.timed_out)
        yield from families.values()
        yield from self._histograms(stats)

        undecodable = CounterMetricFamily(
            "pipeline_jobs_undecodable",
            "Messages skipped because they are not jobs this worker can run.",
            labels=["reason"],
        )
        for reason, count in sorted(m.undecodable.items()):
            undecodable.add_metric([reason], count)
        yield undecodable
        yield CounterMetricFamily(
            "pipeline_consumer_duplicates_dropped",
            "Messages delivered twice by the consumer within one assignment and dropped.",
            value=m.duplicates,
        )
        yield CounterMetricFamily(
            "pipeline_jobs_progress_reports", "Calls of ctx.progress().", value=m.progress
        )
        yield CounterMetricFamily(
            "pipeline_middleware_failures",
            "Middleware hooks that raised (logged; a failed outcome hook keeps the offset open).",
            value=m.hook_failures,
        )
        yield from self._tenants(m)
        yield from self._moves(m)
        yield from self._poison(m)
        yield from self._consumer(m)
        yield from self._gauges()

    def _tenants(self, m: WorkerMetrics) -> Iterator[Metric]:
        """By tenant: those named in ``worker.tenants.named``, the rest as ``other`` (no
        samples when none are named), so the label's values are bounded by the settings."""
        started = CounterMetricFamily(
            "pipeline_tenant_jobs_started",
            "Jobs whose handler was called, by tenant (unnamed tenants: other).",
            labels=["tenant"],
        )
        wait = HistogramMetricFamily(
            "pipeline_tenant_job_queue_latency_seconds",
            "Enqueue (or not_before) to handler start, by tenant (unnamed tenants: other).",
            labels=["tenant"],
        )
        for name, stats in sorted(m.tenants.items()):
            started.add_metric([name], stats.started)
            wait.add_metric([name], stats.wait.buckets(), stats.wait.sum)
        yield started
        yield wait

    def _poison(self, m: WorkerMetrics) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "pipeline_poison_pills",
            "Jobs dead-lettered without running: they killed their worker every time they ran "
            "alone on their partition.",
            value=m.poison_pills,
        )
        yield CounterMetricFamily(
            "pipeline_quarantines",
            "Partitions taken over from a worker that died, whose jobs then ran in small windows.",
            value=m.quarantines,
        )
        yield GaugeMetricFamily(
            "pipeline_partitions_quarantined",
            "Owned partitions whose jobs run in small windows after their previous owner died.",
            value=m.quarantined,
        )

    def _moves(self, m: WorkerMetrics) -> Iterator[Metric]:
        retries = CounterMetricFamily(
            "pipeline_jobs_retried",
            "Failed jobs moved to a retry tier or the deferred topic.",
            labels=["type", "route"],
        )
        for (job_type, route), count in sorted(m.retries.items()):
            retries.add_metric([job_type, route], count)
        yield retries
        dead = CounterMetricFamily(
            "pipeline_jobs_dead_lettered",
            "Jobs and messages moved to the dead-letter topic.",
            labels=["type", "reason"],
        )
        for (job_type, reason), count in sorted(m.dead_letters.items()):
            dead.add_metric([job_type, reason], count)
        yield dead
        relayed = CounterMetricFamily(
            "pipeline_retries_released",
            "Retried jobs returned from a retry tier to their priority topic when due.",
            labels=["topic"],
        )
        for topic, count in sorted(m.relayed.items()):
            relayed.add_metric([topic], count)
        yield relayed
        yield CounterMetricFamily(
            "pipeline_finished_skipped",
            "Messages skipped because a previous owner had finished them, run or moved "
            "(commit metadata).",
            value=m.skipped_finished,
        )
        yield GaugeMetricFamily(
            "pipeline_partitions_held_offset_map",
            "Owned partitions taking no new jobs until their map of finished offsets fits "
            "in the commit metadata again.",
            value=m.map_held,
        )
        yield CounterMetricFamily(
            "pipeline_offset_map_holds",
            "Times a partition stopped taking new jobs because its map of finished offsets "
            "grew too large for the commit metadata.",
            value=m.map_holds,
        )
        yield CounterMetricFamily(
            "pipeline_offset_map_cut",
            "Commits whose map of finished offsets was cut short to fit the metadata limit "
            "(the jobs above the cut run again after a crash).",
            value=m.map_cut,
        )
        yield CounterMetricFamily(
            "pipeline_events_dropped",
            "Lifecycle events (events = all) dropped or not delivered: they are best effort.",
            value=m.events_dropped,
        )
        yield CounterMetricFamily(
            "pipeline_move_transactions",
            "Kafka transactions committed with moves and their offsets.",
            value=m.transactions,
        )
        deduplicated = CounterMetricFamily(
            "pipeline_jobs_deduplicated",
            "Jobs acknowledged without running because their idempotency key was taken.",
            labels=["type", "verdict"],
        )
        for (job_type, verdict), count in sorted(m.deduplicated.items()):
            deduplicated.add_metric([job_type, verdict], count)
        yield deduplicated
        yield GaugeMetricFamily(
            "pipeline_dedup_keys", "Idempotency keys kept for the owned partitions.", m.dedup_keys
        )
        yield CounterMetricFamily(
            "pipeline_dedup_keys_expired",
            "Idempotency keys dropped at the end of their TTL.",
            value=m.dedup_expired,
        )

    def _histograms(self, stats: list[TypeStats]) -> Iterator[Metric]:
        duration = HistogramMetricFamily(
            "pipeline_job_duration_seconds", "Handler run time.", labels=["type"]
        )
        merged: dict[str, tuple[list[int], float]] = {}
        for s in stats:
            counts, total = merged.get(s.job_type, ([0] * len(s.duration.counts), 0.0))
            total += s.duration.merge_into(counts)
            merged[s.job_type] = (counts, total)
        for job_type, (counts, total) in sorted(merged.items()):
            duration.add_metric([job_type], Histogram(DURATION_BUCKETS).buckets(counts), total)
        yield duration
        latency = HistogramMetricFamily(
            "pipeline_job_queue_latency_seconds",
            "Enqueue (or not_before) to handler start.",
            labels=["priority"],
        )
        by_priority: dict[str, tuple[list[int], float]] = {}
        for s in stats:
            counts, total = by_priority.get(s.priority, ([0] * len(s.latency.counts), 0.0))
            total += s.latency.merge_into(counts)
            by_priority[s.priority] = (counts, total)
        for priority, (counts, total) in sorted(by_priority.items()):
            latency.add_metric([priority], Histogram(LATENCY_BUCKETS).buckets(counts), total)
        yield latency

    def _consumer(self, m: WorkerMetrics) -> Iterator[Metric]:
        commits = CounterMetricFamily(
            "pipeline_commits", "Offset commits by mode and result.", labels=["mode", "result"]
        )
        for (mode, result), count in sorted(m.commits.items()):
            commits.add_metric([mode, result], count)
        yield commits
        latency = HistogramMetricFamily(
            "pipeline_commit_latency_seconds", "Offset commit round trip."
        )
        latency.add_metric([], m.commit_latency.buckets(), m.commit_latency.sum)
        yield latency
        rebalances = CounterMetricFamily(
            "pipeline_rebalances", "Partition assignment changes by kind.", labels=["kind"]
        )
        for kind, count in sorted(m.rebalances.items()):
            rebalances.add_metric([kind], count)
        yield rebalances
        lag = GaugeMetricFamily(
            "pipeline_consumer_lag",
            "Messages between the consumer's position and the partition's end.",
            labels=["topic", "partition"],
        )
        for (topic, partition), value in sorted(dict(m.lag).items()):
            lag.add_metric([topic, str(partition)], value)
        yield lag

    def _gauges(self) -> Iterator[Metric]:
        g = self._g
        in_flight = g.in_flight()
        yield GaugeMetricFamily(
            "pipeline_jobs_in_flight", "Jobs started and not finished.", value=in_flight
        )
        yield GaugeMetricFamily(
            "pipeline_worker_concurrency",
            "Jobs this process runs at most at once.",
            value=g.concurrency,
        )
        yield GaugeMetricFamily(
            "pipeline_worker_utilization_ratio",
            "Busy job slots over the concurrency: jobs in flight / pipeline_worker_concurrency.",
            value=in_flight / g.concurrency if g.concurrency else 0.0,
        )
        yield GaugeMetricFamily(
            "pipeline_worker_threads",
            "Pool threads started for plain-function handlers (grown on demand, up to --threads).",
            value=g.threads(),
        )
        yield GaugeMetricFamily(
            "pipeline_worker_threads_overdue",
            "Pool threads still running a plain-function job that ended (its time limit, or an "
            "interceptor gave up on it): a thread cannot be killed; one whose job never returns "
            "stays overdue for good.",
            value=g.overdue(),
        )
        buffered = GaugeMetricFamily(
            "pipeline_jobs_buffered",
            "Jobs taken from Kafka and not started yet.",
            labels=["priority"],
        )
        for priority, count in sorted(g.buffered().items()):
            buffered.add_metric([priority], count)
        yield buffered
        yield GaugeMetricFamily(
            "pipeline_partitions_assigned", "Partitions this process owns.", value=g.assigned()
        )
        yield GaugeMetricFamily(
            "pipeline_partitions_paused",
            "Owned partitions paused because their buffer is full.",
            value=g.paused(),
        )


def make_registry(metrics: WorkerMetrics, gauges: Gauges) -> CollectorRegistry:
    """A registry of its own (not the global one), so two workers in one process never clash."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector(metrics, gauges))
    return add_process_metrics(registry)
