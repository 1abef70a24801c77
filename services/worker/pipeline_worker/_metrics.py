"""Prometheus metrics of a worker process, counted in plain integers off the hot path.

Counting a job must cost next to nothing: the runtime bumps plain attributes of a
:class:`TypeStats` (one per job type and priority, found once per job) and a custom collector
turns them into metric families when Prometheus scrapes. Gauges (in flight, buffered, lag) are
read from the runtime at scrape time through callables.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from pipeline._metricsserver import add_process_metrics

DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
)  # fmt: skip
COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


def per_second(count: int, seconds: float) -> float | None:
    """``count / seconds`` with at least three significant digits (0.333, 2.5, 53412), for log
    lines: rounding a rate of a few jobs over a long run to an integer would make it 0."""
    if seconds <= 0:
        return None
    rate = count / seconds
    if rate == 0:
        return 0.0
    return round(rate, max(0, 2 - math.floor(math.log10(rate))))


class Histogram:
    """Bucket counts and a sum; ``observe`` is one bisect and two additions."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def merge_into(self, counts: list[int]) -> float:
        for index, count in enumerate(self.counts):
            counts[index] += count
        return self.sum

    def buckets(self, counts: list[int] | None = None) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs as Prometheus wants them."""
        running = 0
        out = []
        for bound, count in zip((*self.bounds, float("inf")), counts or self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class TypeStats:
    """Counters of one job type at one priority."""

    __slots__ = (
        "duration",
        "failed",
        "job_type",
        "latency",
        "priority",
        "started",
        "succeeded",
        "timed_out",
    )

    def __init__(self, job_type: str, priority: str) -> None:
        self.job_type = job_type
        self.priority = priority
        self.started = 0
        self.succeeded = 0
        self.failed = 0
        self.timed_out = 0
        self.duration = Histogram(DURATION_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)


@dataclass(eq=False)
class WorkerMetrics:
    """Everything the worker counts; the runtime writes, :class:`WorkerCollector` reads."""

    stats: dict[tuple[str, str], TypeStats] = field(default_factory=dict)
    undecodable: dict[str, int] = field(default_factory=dict)
    """By reason: ``decode_error`` or ``unknown_type``."""
    duplicates: int = 0
    progress: int = 0
    hook_failures: int = 0
    commits: dict[tuple[str, str], int] = field(default_factory=dict)
    """By (mode, result): mode ``async``/``sync``, result ``ok``/``error``."""
    commit_latency: Histogram = field(default_factory=lambda: Histogram(COMMIT_BUCKETS))
    rebalances: dict[str, int] = field(default_factory=dict)
    """By kind: ``assign``, ``revoke``, ``lost``."""
    lag: dict[tuple[str, int], int] = field(default_factory=dict)
    retries: dict[tuple[str, str], int] = field(default_factory=dict)
    """By (job type, route): route ``retry.<n>`` or ``deferred``."""
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    """By (job type, reason)."""
    skipped_moved: int = 0
    """Messages a previous owner moved already (listed in the commit metadata), not run again."""
    transactions: int = 0
    relayed: dict[str, int] = field(default_factory=dict)
    """Retried jobs the retry relay returned to their priority topic, by tier topic."""
    poison_pills: int = 0
    """Jobs dead-lettered without running because they killed their worker too often."""
    quarantines: int = 0
    """Partitions taken over from an owner that died, whose suspects then ran in windows."""
    quarantined: int = 0
    """Owned partitions in quarantine now (the consumer thread writes it)."""
    deduplicated: dict[tuple[str, str], int] = field(default_factory=dict)
    """Jobs acknowledged without running, by (job type, verdict): ``duplicate`` (another job
    has the key) or ``done`` (the same job completed already)."""
    dedup_keys: int = 0
    """Idempotency keys kept for the owned partitions (updated now and then)."""
    dedup_expired: int = 0
    """Idempotency keys dropped at the end of their TTL."""

    def count_move(self, job_type: str, dead: bool, reason: str) -> None:
        table = self.dead_letters if dead else self.retries
        key = (job_type, reason)
        table[key] = table.get(key, 0) + 1

    def type_stats(self, job_type: str, priority: str) -> TypeStats:
        key = (job_type, priority)
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = TypeStats(job_type, priority)
        return stats

    def count_dedup(self, job_type: str, verdict: str) -> None:
        key = (job_type, verdict)
        self.deduplicated[key] = self.deduplicated.get(key, 0) + 1

    def count(self, table: dict[str, int], key: str, amount: int = 1) -> None:
        table[key] = table.get(key, 0) + amount

    def count_commit(self, mode: str, ok: bool, seconds: float | None) -> None:
        key = (mode, "ok" if ok else "error")
        self.commits[key] = self.commits.get(key, 0) + 1
        if seconds is not None:
            self.commit_latency.observe(seconds)


@dataclass(frozen=True)
class Gauges:
    """Live values read at scrape time."""

    in_flight: Callable[[], int]
    concurrency: int
    threads: Callable[[], int]
    """Pool threads started so far for plain-function handlers."""
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
        yield from self._moves(m)
        yield from self._poison(m)
        yield from self._consumer(m)
        yield from self._gauges()

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
            "pipeline_moves_skipped",
            "Messages skipped because a previous owner had moved them (commit metadata).",
            value=m.skipped_moved,
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
