"""The tenants a worker knows: each named one's weight, limits and counters, and ``other``.

Jobs carry their tenant in the envelope (``Job.tenant``). The tenants named in the settings
(``worker.tenants.named``) get an entry each, with a :class:`~.limits.TypeLimit` when they have
a concurrency cap or a rate limit; every other tenant (and a job without one) shares the entry
``other``, which has no limit. Entries are made once, from the settings, so tenant names read
from Kafka never grow this table or the metrics' label values.

Caps and rates hold fleet-wide: each worker takes the share that matches its share of the
partitions it consumes (a tenant's jobs may be on any priority topic), as type rates do.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from pipeline._tenantsettings import OTHER_TENANT, TenantSettings

from .._metrics import TenantStats, WorkerMetrics
from .._work import Work
from .limits import TypeLimit

MAX_WEIGHT = 1e12
"""A tenant's weight as dispatch uses it is at most this (a finite whole number of starts)."""


class TenantEntry:
    """What dispatch and metrics need about one tenant label."""

    __slots__ = ("limit", "name", "stats")

    def __init__(self, name: str, limit: TypeLimit[Work] | None, stats: TenantStats) -> None:
        self.name = name
        self.limit = limit
        self.stats = stats


class TenantTable:
    """The named tenants' entries and ``other``'s."""

    def __init__(self, settings: TenantSettings, metrics: WorkerMetrics) -> None:
        self.settings = settings
        now = time.monotonic()
        self.entries: dict[str | None, TenantEntry] = {}
        self.limits: list[TypeLimit[Work]] = []
        for name, options in settings.named.items():
            limit: TypeLimit[Work] | None = None
            if options.concurrency is not None or options.rate_limit is not None:
                limit = TypeLimit[Work](
                    f"tenant {name}",
                    cap=options.concurrency,
                    rate_limit=options.rate_limit,
                    now=now,
                    fleet_cap=options.concurrency is not None,
                )
                limit.set_share(0, 0, now)  # nothing owned yet: the first assignment sets it
                self.limits.append(limit)
            self.entries[name] = TenantEntry(name, limit, metrics.tenant_stats(name))
        self.active = bool(self.entries)
        other = metrics.tenant_stats(OTHER_TENANT) if self.active else TenantStats(OTHER_TENANT)
        self.other = TenantEntry(OTHER_TENANT, None, other)
        """Whether jobs get an entry at all (not when no tenant is named)."""
        weights = [o.weight for o in settings.named.values() if o.weight is not None]
        least = min([settings.default_weight, *weights])
        self._least = least if least < 1.0 else 1.0
        """Weights below 1 are scaled up, the smallest to 1, keeping their ratios: each lane's
        turn then starts a job (:mod:`.fair`), where tiny weights took millions of empty turns
        (for ever, with a weight too small to add to the credit) to start one."""

    def tag(self, works: Iterable[Work]) -> None:
        """Give each of ``works`` its tenant's limit and counters."""
        entries = self.entries
        other = self.other
        for work in works:
            entry = entries.get(work.job.tenant) or other
            work.tenant_limit = entry.limit
            work.tenant_stats = entry.stats

    def weight(self, tenant: str | None) -> float:
        return min(self.settings.weight_of(tenant) / self._least, MAX_WEIGHT)

    def set_share(self, owned: Mapping[str, int], partitions: Mapping[str, int]) -> None:
        """The assignment changed: each limit takes this worker's share of every partition
        consumed (a tenant's jobs may be on any priority)."""
        mine, total = sum(owned.values()), sum(partitions.values())
        now = time.monotonic()
        for limit in self.limits:
            limit.set_share(mine, total, now)
