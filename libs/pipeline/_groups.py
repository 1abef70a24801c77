"""The consumer groups of a namespace: who reads what, so that ``pipeline status`` finds them.

Pure naming, like :mod:`pipeline._topics`; the worker and the scheduler take their group ids
from here, and the status reader reads the same groups' commits and members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._settings import Settings


def worker_group(settings: Settings) -> str:
    """The workers' group on the priority topics: ``worker.group_id``, else ``<ns>.workers``."""
    return settings.worker.group_id or f"{settings.namespace}.workers"


def retry_group(workers_group: str) -> str:
    """The retry relays' group on the retry tiers (every worker process runs one relay)."""
    return f"{workers_group}.retry"


def scheduler_group(settings: Settings) -> str:
    """The scheduler's leadership group on ``<ns>.scheduler-control``: its only member with
    the partition is the leader."""
    return settings.scheduler.group_id or f"{settings.namespace}.scheduler"


def deferred_group(settings: Settings) -> str:
    """The group whose commits are the scheduler leader's progress through ``<ns>.deferred``
    and the wait tiers (the leader assigns partitions itself; it never joins)."""
    return f"{settings.namespace}.scheduler.deferred"
