"""What one backlog read returns: per partition, per topic, per consumer group, and the whole.

Plain frozen values, read by ``pipeline status``, the exporter, the dashboard and the
workers' heartbeats; :mod:`._backlog` makes them from Kafka.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._deadletters import DlqStats


@dataclass(frozen=True, slots=True)
class PartitionBacklog:
    """One partition: its offsets, the group's commit, and the oldest waiting message's time."""

    partition: int
    start: int
    end: int
    committed: int | None
    """The group's committed offset; ``None`` when it committed nothing (it starts at ``start``)."""
    oldest_ms: int | None
    """Write time (ms since the epoch) of the first message at or after the commit, if any
    (``None`` too when that message carries no timestamp: its age is unknown)."""
    first: int | None = None
    """Offset of that first message (aborted messages and transaction markers skipped), or
    where the read ended when only those are left; ``None`` when it was not read."""

    @property
    def position(self) -> int:
        """Where the group reads next: its commit, else (nothing committed, or a commit out of
        the retained range, which a worker resets to the earliest offset) the earliest retained
        offset."""
        if self.committed is None or not self.start <= self.committed <= self.end:
            return self.start
        return self.committed

    @property
    def waiting(self) -> int:
        """Messages not committed by the group, from the first one a worker would run (a
        transaction's commit marker after it counts as one, an aborted transaction's messages
        and marker after it as many)."""
        first = self.position if self.first is None else max(self.first, self.position)
        return max(0, self.end - first)


@dataclass(frozen=True, slots=True)
class TopicBacklog:
    topic: str
    group: str
    partitions: tuple[PartitionBacklog, ...]

    @property
    def label(self) -> str:
        """The short name: the priority, the retry tier's number, ``deferred`` or ``wait <n>``."""
        parts = self.topic.rsplit(".", 2)
        if parts[-1] == "deferred":
            return "deferred"
        if len(parts) == 3 and parts[1] == "deferred":
            return f"wait {parts[2]}"
        return parts[-1]

    @property
    def waiting(self) -> int:
        return sum(p.waiting for p in self.partitions)

    @property
    def end(self) -> int:
        return sum(p.end for p in self.partitions)

    @property
    def position(self) -> int:
        return sum(p.position for p in self.partitions)

    @property
    def oldest_ms(self) -> int | None:
        stamps = [p.oldest_ms for p in self.partitions if p.oldest_ms is not None and p.waiting]
        return min(stamps, default=None)

    def oldest_age_s(self, at_ms: int) -> float | None:
        """How long the oldest waiting message has waited at ``at_ms`` (None: none waits)."""
        oldest = self.oldest_ms
        return None if oldest is None else max(0.0, (at_ms - oldest) / 1000)


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One member of a consumer group: its client id, host and assigned partitions."""

    client_id: str
    host: str
    partitions: tuple[tuple[str, int], ...]
    member_id: str = ""


@dataclass(frozen=True, slots=True)
class GroupMembers:
    group: str
    state: str
    """The coordinator's view: ``STABLE``, ``EMPTY``, ``DEAD`` (never existed), ..."""
    members: tuple[GroupMember, ...]


@dataclass(frozen=True, slots=True)
class Backlog:
    """One read of a namespace's backlog."""

    read_at: float
    """Wall-clock time of the read (seconds since the epoch): ages are measured from it."""
    jobs: dict[str, TopicBacklog]
    """By priority (``critical``, ``high``, ``default``, ``low``)."""
    retries: tuple[TopicBacklog, ...]
    """The retry tiers, shortest delay first."""
    deferred: tuple[TopicBacklog, ...]
    """``<ns>.deferred``, then the scheduler's wait tiers, shortest first."""
    dead_letters: DlqStats
    """Dead letters retained on ``<ns>.dlq`` by status (pending, replayed, discarded), and the
    pending ones by reason and job type."""
    groups: dict[str, GroupMembers]
    """By role: ``worker`` and ``scheduler``."""

    @property
    def dead_letters_pending(self) -> int:
        return self.dead_letters.depth

    def oldest_age_s(self, priority: str) -> float:
        """Seconds since the oldest job of ``priority`` still waiting was written (0: none)."""
        oldest = self.jobs[priority].oldest_ms
        return 0.0 if oldest is None else max(0.0, self.read_at - oldest / 1000)
