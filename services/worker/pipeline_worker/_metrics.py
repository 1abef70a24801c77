"""Prometheus metrics of a worker process, counted in plain integers off the hot path.

Counting a job must cost next to nothing: the runtime bumps plain attributes of a
:class:`TypeStats` (one per job type and priority, found once per job) and the collector of
:mod:`pipeline_worker._metricsexport` turns them into metric families when Prometheus scrapes.
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left
from dataclasses import dataclass, field

from confluent_kafka import KafkaError

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


EXPECTED_DEAD_REASONS = ("max_attempts", "fatal_error", "timeout", "validation_error")
"""The dead-letter reasons counted from 0 for each registered type (the others are rare)."""


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


class TenantStats:
    """Counters of one tenant named in the settings, or of all the others (``other``)."""

    __slots__ = ("started", "tenant", "wait")

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant
        self.started = 0
        self.wait = Histogram(LATENCY_BUCKETS)
        """Seconds from due (created, or not_before) to start, as ``TypeStats.latency``."""


@dataclass(eq=False)
class WorkerMetrics:
    """Everything the worker counts; the runtime writes, :class:`WorkerCollector` reads."""

    stats: dict[tuple[str, str], TypeStats] = field(default_factory=dict)
    tenants: dict[str, TenantStats] = field(default_factory=dict)
    """By tenant label: the tenants named in the settings and ``other`` (none if none are)."""
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
    skipped_finished: int = 0
    """Messages a previous owner finished already (ran or moved, listed in the commit
    metadata), not run again."""
    map_held: int = 0
    """Owned partitions taking no new jobs because their finished-offset map is too large for
    the commit metadata (the consumer thread writes it)."""
    map_holds: int = 0
    """Times a partition was held so."""
    map_cut: int = 0
    """Commits whose finished-offset map was cut short to fit (the jobs above the cut would
    run again after a crash)."""
    transactions: int = 0
    events_dropped: int = 0
    """Lifecycle events of level ``all`` dropped or not delivered (best effort)."""
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

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held by the counts below: the loop, the consumer thread and the relay thread share some
    of their tables, and ``table[key] = table.get(key, 0) + 1`` can lose a count between
    threads. (The per-job counters have a single writer each and take no lock.)"""

    def count_move(self, job_type: str, dead: bool, reason: str) -> None:
        table = self.dead_letters if dead else self.retries
        key = (job_type, reason)
        with self._lock:
            table[key] = table.get(key, 0) + 1

    def expect_moves(self, job_type: str, tiers: int) -> None:
        """Count ``job_type``'s moves from 0: to each of ``tiers`` retry tiers, and to the
        dead-letter topic for the reasons a job of a registered type is dead-lettered with."""
        with self._lock:
            for tier in range(tiers):
                self.retries.setdefault((job_type, f"retry.{tier}"), 0)
            for reason in EXPECTED_DEAD_REASONS:
                self.dead_letters.setdefault((job_type, reason), 0)

    def type_stats(self, job_type: str, priority: str) -> TypeStats:
        key = (job_type, priority)
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = TypeStats(job_type, priority)
        return stats

    def tenant_stats(self, tenant: str) -> TenantStats:
        stats = self.tenants.get(tenant)
        if stats is None:
            stats = self.tenants[tenant] = TenantStats(tenant)
        return stats

    def count_dedup(self, job_type: str, verdict: str) -> None:
        key = (job_type, verdict)
        self.deduplicated[key] = self.deduplicated.get(key, 0) + 1

    def count(self, table: dict[str, int], key: str, amount: int = 1) -> None:
        with self._lock:
            table[key] = table.get(key, 0) + amount

    def count_commit(
        self, mode: str, ok: bool, seconds: float | None, error: KafkaError | None = None
    ) -> None:
        """A commit ended; one refused as the group rebalances (``error`` says so) counts as
        ``rebalance``, not ``error``: the next one, after the rebalance, takes its offsets."""
        result = "ok" if ok else "error"
        if error is not None and error.code() in _REBALANCING:
            result = "rebalance"
        key = (mode, result)
        with self._lock:
            self.commits[key] = self.commits.get(key, 0) + 1
        if seconds is not None:
            self.commit_latency.observe(seconds)

    def count_transaction(self) -> None:
        """A transaction committed (the moves', on the consumer thread, or the relay's)."""
        with self._lock:
            self.transactions += 1


_REBALANCING = frozenset(
    {
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_MEMBER_EPOCH,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError._ASSIGNMENT_LOST,
    }
)
"""The errors of a commit refused because the group rebalances (classic and consumer
protocols): its partitions are being handed over, and the offsets go with the next commit."""
