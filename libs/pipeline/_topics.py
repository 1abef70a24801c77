"""Topic names of a namespace (DESIGN section 3) and the consumer groups that read them.
Pure naming; no Kafka calls here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._job import Priority

if TYPE_CHECKING:
    from ._settings import Settings


@dataclass(frozen=True, slots=True)
class TopicNames:
    """The names of every topic in namespace ``ns``."""

    namespace: str

    def jobs(self, priority: Priority | str) -> str:
        return f"{self.namespace}.jobs.{Priority(priority).value}"

    def retry(self, tier: int) -> str:
        """Retry tier ``tier``, counting from 0."""
        return f"{self.retry_prefix}{tier}"

    @property
    def retry_prefix(self) -> str:
        """What every retry tier's name starts with."""
        return f"{self.namespace}.retry."

    def tier_number(self, topic: str) -> int | None:
        """The number of retry tier ``topic`` of this namespace (None: it is none)."""
        prefix = self.retry_prefix
        number = topic[len(prefix) :] if topic.startswith(prefix) else ""
        if not number.isascii() or not number.isdigit() or (number[0] == "0" and number != "0"):
            return None
        return int(number)

    @property
    def deferred(self) -> str:
        return f"{self.namespace}.deferred"

    @property
    def dlq(self) -> str:
        return f"{self.namespace}.dlq"

    @property
    def dlq_state(self) -> str:
        """Compacted: what ``pipeline dlq`` replayed or discarded, by dead-letter id."""
        return f"{self.namespace}.dlq-state"

    @property
    def dedup(self) -> str:
        """Compacted: the idempotency keys each job partition has seen, partitioned like the
        job topics (partition ``p`` holds the keys of partition ``p`` of every priority)."""
        return f"{self.namespace}.dedup"

    @property
    def schedules(self) -> str:
        return f"{self.namespace}.schedules"

    @property
    def scheduler_state(self) -> str:
        return f"{self.namespace}.scheduler-state"

    @property
    def events(self) -> str:
        return f"{self.namespace}.events"

    @property
    def workers(self) -> str:
        """Compacted: each worker process's latest heartbeat, by its client id (a topic; the
        workers' consumer group of the same default name is another thing)."""
        return f"{self.namespace}.workers"

    def all_jobs(self) -> list[str]:
        return [self.jobs(p) for p in Priority]


# The consumer groups of the services (the worker's runtime and retry relay, the scheduler's
# leadership and deferred consumer), for them and for what reads their commits.
def worker_group(settings: Settings) -> str:
    """The workers' group, on the priority topics."""
    return settings.worker.group_id or f"{settings.namespace}.workers"


def retry_group(settings: Settings) -> str:
    """The retry relays' group, on the retry tiers: one per namespace, whatever the workers'
    groups are called (the tiers belong to the namespace; two relay groups would each return
    every retried job)."""
    return f"{settings.namespace}.workers.retry"


def former_retry_group(settings: Settings) -> str | None:
    """The relay's group before it was one per namespace (``<workers group>.retry``), where
    that is another group: a starting relay takes over from it
    (``pipeline_worker.recovery.handover``)."""
    former = f"{worker_group(settings)}.retry"
    return None if former == retry_group(settings) else former


def deferred_group(settings: Settings) -> str:
    """The scheduler leader's consumer of ``<ns>.deferred`` and the wait tiers."""
    return f"{settings.namespace}.scheduler.deferred"


def scheduler_group(settings: Settings) -> str:
    """The schedulers' leadership group (on ``<ns>.scheduler-control``)."""
    return settings.scheduler.group_id or f"{settings.namespace}.scheduler"


def moved_to(settings: Settings) -> list[str]:
    """The topics a worker moves jobs to, and writes their events to: the retry tiers, the
    deferred jobs, the dead letters, and ``<ns>.events`` unless events are off."""
    names = TopicNames(settings.namespace)
    topics = [names.retry(tier) for tier in range(len(settings.topics.retry_delays_s))]
    topics += [names.deferred, names.dlq]
    if settings.events != "off":
        topics.append(names.events)
    return topics
