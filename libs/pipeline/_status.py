"""``pipeline status``: one snapshot of a namespace, read from Kafka alone.

Per priority topic the backlog (end offsets minus the workers' group commits) and how long the
oldest waiting job has waited (the timestamp of the message at the committed offset); the same
for the retry tiers (the retry relays' group) and the scheduler's deferred topics (the
scheduler leader's commits, which stay at the lowest job it still holds); the members of the
workers' and the scheduler's groups; the pending dead letters (as ``pipeline dlq stats``
counts them); and each cron schedule's last and next fire. Rates need two snapshots:
:func:`rates` compares them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._adminsession import AdminSession, PartitionOffsets
from ._cronexpr import next_fire_ms
from ._cronstate import read_last_fires
from ._deadletters import dlq_depth
from ._errors import TopicMissingError
from ._groupread import (
    GroupInfo,
    Member,
    committed_offsets,
    describe_groups,
    head_timestamps,
)
from ._job import now_ms
from ._schedule import read_schedules
from ._topics import TopicNames, deferred_group, retry_group, scheduler_group, worker_group
from ._topicspec import deferred_tier_topic, scheduler_control_topic

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = [
    "GroupInfo",
    "Member",
    "PartitionLag",
    "ScheduleDue",
    "StatusSnapshot",
    "TopicLag",
    "rates",
    "read_status",
]


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition: its end, the group's committed offset (``None``: nothing committed, the
    group starts at the earliest offset ``start``) and the first waiting message's timestamp."""

    partition: int
    start: int
    end: int
    committed: int | None
    oldest_at: int | None

    @property
    def position(self) -> int:
        """Where the group reads next (its commit, else the earliest retained offset)."""
        return self.start if self.committed is None else max(self.committed, self.start)

    @property
    def backlog(self) -> int:
        return max(0, self.end - self.position)


@dataclass(frozen=True, slots=True)
class TopicLag:
    """A topic's backlog for the group that consumes it; ``name`` is its short label
    (``high``, a tier number, ``deferred``)."""

    name: str
    topic: str
    group: str
    partitions: tuple[PartitionLag, ...]

    @property
    def backlog(self) -> int:
        """Messages not yet committed by the group (transaction markers count, a few)."""
        return sum(p.backlog for p in self.partitions)

    @property
    def end(self) -> int:
        return sum(p.end for p in self.partitions)

    @property
    def position(self) -> int:
        return sum(p.position for p in self.partitions)

    @property
    def oldest_at(self) -> int | None:
        stamps = [p.oldest_at for p in self.partitions if p.oldest_at is not None and p.backlog]
        return min(stamps, default=None)

    def oldest_age_s(self, at_ms: int) -> float | None:
        """How long the oldest waiting message has waited at ``at_ms`` (None: none waits)."""
        oldest = self.oldest_at
        return None if oldest is None else max(0.0, (at_ms - oldest) / 1000)


@dataclass(frozen=True, slots=True)
class ScheduleDue:
    """A cron schedule, its last fire handled by the scheduler (``None``: none yet, counted
    from its creation) and its next fire."""

    name: str
    cron: str
    timezone: str
    job_type: str
    enabled: bool
    last_fire: int | None
    next_fire: int | None

    def overdue_s(self, at_ms: int) -> float:
        """How far past its next fire the schedule is at ``at_ms`` (0 when not due yet)."""
        if not self.enabled or self.next_fire is None:
            return 0.0
        return max(0.0, (at_ms - self.next_fire) / 1000)


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    """Everything ``pipeline status`` shows, as of ``at`` (ms since the epoch)."""

    namespace: str
    at: int
    priorities: tuple[TopicLag, ...]
    retry_tiers: tuple[TopicLag, ...]
    deferred: tuple[TopicLag, ...]
    workers: GroupInfo
    scheduler: GroupInfo
    dead_letters_pending: int
    schedules: tuple[ScheduleDue, ...]

    @property
    def leader(self) -> Member | None:
        """The scheduler leader: the member of its group that owns the control partition."""
        control = scheduler_control_topic(self.namespace)
        for member in self.scheduler.members:
            if any(topic == control for topic, _ in member.partitions):
                return member
        return None

    @property
    def cron_lateness_s(self) -> float:
        """The most overdue enabled schedule's lateness: how long a due fire has waited for the
        leader. It grows while no scheduler leads."""
        return max((s.overdue_s(self.at) for s in self.schedules), default=0.0)


def rates(before: TopicLag, after: TopicLag, seconds: float) -> tuple[float, float]:
    """Messages per second in (end offsets) and out (group commits) between two snapshots."""
    if seconds <= 0:
        return 0.0, 0.0
    rate_in = max(0, after.end - before.end) / seconds
    rate_out = max(0, after.position - before.position) / seconds
    return rate_in, rate_out


def _lags(
    session: AdminSession,
    settings: Settings,
    group: str,
    topics: dict[str, str],
    *,
    offsets: dict[str, tuple[PartitionOffsets, ...]],
    timeout: float,
) -> tuple[TopicLag, ...]:
    """``topics`` maps a topic to its label; topics missing from ``offsets`` are left out."""
    present = {topic: label for topic, label in topics.items() if topic in offsets}
    wheres = [(topic, p.partition) for topic in present for p in offsets[topic]]
    committed = session.retry(lambda: committed_offsets(session, group, wheres))
    lags = {
        topic: [
            PartitionLag(p.partition, p.start, p.end, committed.get((topic, p.partition)), None)
            for p in offsets[topic]
        ]
        for topic in present
    }
    waiting = {
        (topic, lag.partition): lag.position
        for topic, parts in lags.items()
        for lag in parts
        if lag.backlog
    }
    heads = head_timestamps(settings, waiting, timeout=min(timeout, 10.0))
    return tuple(
        TopicLag(
            label,
            topic,
            group,
            tuple(
                dataclasses.replace(lag, oldest_at=heads.get((topic, lag.partition)))
                for lag in lags[topic]
            ),
        )
        for topic, label in present.items()
    )


def _schedules(settings: Settings, timeout: float) -> tuple[ScheduleDue, ...]:
    schedules = read_schedules(settings, timeout)
    if not schedules:
        return ()
    last_fires = read_last_fires(settings, timeout)
    due = []
    for name, schedule in sorted(schedules.items()):
        last = last_fires.get(name)
        after = last if last is not None else schedule.created_at
        try:
            following: int | None = next_fire_ms(schedule.cron, schedule.timezone, after)
        except ValueError:  # read_schedules keeps only valid schedules; be safe anyway
            following = None
        due.append(
            ScheduleDue(
                name,
                schedule.cron,
                schedule.timezone,
                schedule.job_type,
                schedule.enabled,
                last,
                following,
            )
        )
    return tuple(sorted(due, key=lambda s: (s.next_fire is None, s.next_fire or 0, s.name)))


def read_status(settings: Settings, *, timeout: float = 30.0) -> StatusSnapshot:
    """Read one :class:`StatusSnapshot` of ``settings.namespace``.

    Raises :class:`KafkaUnavailableError` when Kafka does not answer within ``timeout``
    seconds and :class:`TopicMissingError` when the namespace's job topics do not exist.
    Nothing is written and no group is joined.
    """
    names = TopicNames(settings.namespace)
    ns = settings.namespace
    session = AdminSession(settings, timeout)
    metadata = session.metadata()
    priorities = {names.jobs(p): p.value for p in settings.priorities}
    tiers = {names.retry(i): str(i) for i in range(len(settings.topics.retry_delays_s))}
    deferred = {names.deferred: "deferred"} | {
        deferred_tier_topic(ns, i): f"wait {i}" for i in range(len(settings.scheduler.wait_tiers_s))
    }
    existing = [t for t in [*priorities, *tiers, *deferred] if t in metadata.topics]
    missing = [t for t in priorities if t not in metadata.topics]
    if missing:
        raise TopicMissingError(missing, ns)
    offsets = session.offsets(metadata, existing)
    workers = worker_group(settings)
    at = now_ms()
    groups = describe_groups(session, [workers, scheduler_group(settings)])
    return StatusSnapshot(
        namespace=ns,
        at=at,
        priorities=_lags(session, settings, workers, priorities, offsets=offsets, timeout=timeout),
        retry_tiers=_lags(
            session, settings, retry_group(settings), tiers, offsets=offsets, timeout=timeout
        ),
        deferred=_lags(
            session, settings, deferred_group(settings), deferred, offsets=offsets, timeout=timeout
        ),
        workers=groups[workers],
        scheduler=groups[scheduler_group(settings)],
        dead_letters_pending=dlq_depth(settings, timeout=session.remaining()),
        schedules=_schedules(settings, session.remaining()),
    )
