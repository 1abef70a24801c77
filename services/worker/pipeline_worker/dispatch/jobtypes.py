"""The job types a worker has met: handler, payload codec, limits and counters of each.

The hot path looks a type up once per job (one dict lookup) and finds everything there. Rate
limits hold fleet-wide: each worker takes the share of a type's rate that matches its share
of the partitions carrying that type (see :mod:`.limits`), updated on every assignment change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from pipeline import JobType, PayloadCodec, Pipeline, Priority

from .._metrics import TypeStats, WorkerMetrics
from .._work import Work
from .limits import TypeLimit

_log = logging.getLogger("pipeline.worker.jobs")


class TypeEntry:
    """What the hot path needs about one job type."""

    __slots__ = ("codec", "job_type", "limit", "loads", "stats", "time_limit")

    def __init__(
        self, job_type: JobType, limit: TypeLimit[Work] | None, stats: list[TypeStats]
    ) -> None:
        self.job_type = job_type
        self.limit = limit
        self.stats = stats
        """Counters by priority index."""
        self.codec: PayloadCodec = job_type.codec
        self.loads = job_type.payload_loaders(self.codec)
        """The handler's keyword arguments from payload bytes, by the encoding the job's
        envelope states (see ``JobType.payload_loaders``)."""
        self.time_limit = job_type.options.time_limit


class TypeTable:
    """Entries of the application's job types, made on first use."""

    def __init__(
        self,
        app: Pipeline,
        metrics: WorkerMetrics,
        priorities: Sequence[Priority],
        topics: Mapping[Priority, str],
    ) -> None:
        self._app = app
        self._metrics = metrics
        self._priorities = list(priorities)
        self._topic_of = dict(topics)
        self.entries: dict[str, TypeEntry] = {}
        self.limits: list[TypeLimit[Work]] = []
        self._owned: dict[str, int] = {}
        self._partitions: dict[str, int] = {}
        tiers = len(app.settings.topics.retry_delays_s)
        for job_type in app.registry:
            # Every registered type's counters exist from the start, at 0: a counter that
            # first appears with a count already in it shows no increase to rate(), and a
            # burst of failures at a start went unseen by the failure-rate alert.
            self.find(job_type.name)
            metrics.expect_moves(job_type.name, tiers)

    def find(self, name: str) -> TypeEntry | None:
        """The entry of job type ``name``, or None if the application has no such handler."""
        entry = self.entries.get(name)
        if entry is not None:
            return entry
        job_type = self._app.registry.find(name)
        if job_type is None:
            return None  # not cached: names from bad input must not grow the table
        options = job_type.options
        limit: TypeLimit[Work] | None = None
        if options.concurrency is not None or options.rate_limit is not None:
            now = time.monotonic()
            limit = TypeLimit[Work](
                name, cap=options.concurrency, rate_limit=options.rate_limit, now=now
            )
            limit.set_share(*self._share_of(job_type), now)
            self.limits.append(limit)
        stats = [self._metrics.type_stats(name, p.value) for p in self._priorities]
        entry = self.entries[name] = TypeEntry(job_type, limit, stats)
        return entry

    def set_share(self, owned: Mapping[str, int], partitions: Mapping[str, int]) -> None:
        """The assignment changed: ``owned`` and ``partitions`` count, per priority topic, the
        partitions this worker owns and all of them."""
        self._owned = dict(owned)
        self._partitions = dict(partitions)
        now = time.monotonic()
        for name, entry in self.entries.items():
            if entry.limit is not None:
                entry.limit.set_share(*self._share_of(entry.job_type), now)
                _log.debug("rate share", extra={"job_type": name, "rate": entry.limit.rate})

    def _share_of(self, job_type: JobType) -> tuple[int, int]:
        """(owned, total) partitions that carry ``job_type``: those of its priority's topic.

        A type's jobs go to the topic of its declared priority unless an enqueue overrides it;
        if this worker consumes none of that topic's partitions, all consumed topics count:
        the jobs it meets were enqueued at another priority, and a share of 0 would hold them
        (and their partitions' commit points) for good. The fleet may then run the type a
        little over its rate, by that share at most.
        """
        topic = self._topic_of.get(job_type.options.priority)
        if topic is not None and self._partitions.get(topic) and self._owned.get(topic):
            return self._owned[topic], self._partitions[topic]
        return sum(self._owned.values()), sum(self._partitions.values())
