"""``pipeline status``: one snapshot of a namespace, read from Kafka alone.

The backlog, the oldest waiting job, the retry tiers, the deferred topics, the groups' members
and the dead letters pending are one :class:`~pipeline._backlogmodel.Backlog` read (the reads the
exporter makes, :mod:`._backlog`). On top of it ``pipeline status`` shows what only it has: the
scheduler leader (the member of its group owning the control partition), each cron schedule's
last and next fire and the lateness of the most overdue one, each worker's heartbeat (jobs in
flight, utilization: :mod:`._workerbeats`), and the rates in and out, which need two snapshots:
:func:`rates` compares them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._backlog import BacklogReader
from ._backlogmodel import GroupMember, GroupMembers, TopicBacklog
from ._cronexpr import next_fire_ms
from ._cronstate import read_last_fires
from ._errors import ConfigurationError
from ._schedule import count_from
from ._scheduletable import read_schedules
from ._topicspec import scheduler_control_topic
from ._workerbeats import WorkerBeat, by_client_id, read_process_beats

if TYPE_CHECKING:
    from ._settings import Settings

__all__ = [
    "ScheduleDue",
    "StatusSnapshot",
    "rates",
    "read_status",
    "topic_rates",
]


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
    priorities: tuple[TopicBacklog, ...]
    retry_tiers: tuple[TopicBacklog, ...]
    deferred: tuple[TopicBacklog, ...]
    workers: GroupMembers
    scheduler: GroupMembers
    dead_letters_pending: int
    schedules: tuple[ScheduleDue, ...]
    worker_beats: dict[str, WorkerBeat] = field(default_factory=dict)
    """Each worker process's latest heartbeat on ``<ns>.workers``, by record key (see
    :func:`~pipeline._workerbeats.read_process_beats`), stale ones included."""

    def beat_of(self, member: GroupMember) -> WorkerBeat | None:
        """The worker member's heartbeat, unless it has none or it was stale at :attr:`at`.

        The heartbeat carrying the member's id is its own, even where replicas share a client
        id. Else (a worker before member ids, or one that wrote before it joined) the member's
        client id picks one among the heartbeats no other member's id claims, as
        :func:`~pipeline._workerbeats.by_client_id` does: none where several live ones share it.
        """
        beats = self.worker_beats.values()
        if member.member_id:
            for beat in beats:
                if beat.member_id == member.member_id:
                    return None if beat.stale_at(self.at) else beat
        claimed = {m.member_id for m in self.workers.members if m.member_id}
        unclaimed = [beat for beat in beats if beat.member_id not in claimed]
        found = by_client_id(unclaimed, self.at).get(member.client_id)
        return None if found is None or found.stale_at(self.at) else found

    @property
    def topics(self) -> tuple[TopicBacklog, ...]:
        """Every topic read: the priorities, the retry tiers, then the deferred ones."""
        return self.priorities + self.retry_tiers + self.deferred

    @property
    def leader(self) -> GroupMember | None:
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


def rates(before: TopicBacklog, after: TopicBacklog, seconds: float) -> tuple[float, float]:
    """Messages per second in (end offsets) and out (group commits) between two snapshots.

    Counted per partition, so a partition that went back cannot cancel what the others did.
    An end offset that went back (the topic was recreated) counts from 0, as Prometheus counts
    a counter reset; a commit that went back (offsets reset, or expired) counts nothing; a start
    moved by retention or delete-records, under a partition the group never committed or whose
    commit retention left behind, is no job done. A partition added since counts from offset 0.
    """
    if seconds <= 0:
        return 0.0, 0.0
    earlier = {p.partition: p for p in before.partitions}
    written = done = 0
    for now in after.partitions:
        then = earlier.get(now.partition)
        then_end = 0 if then is None else then.end
        written += now.end - then_end if now.end >= then_end else now.end
        if now.committed is not None and now.start <= now.committed <= now.end:
            then_position = now.start if then is None else then.position
            done += max(0, now.position - then_position)
    return written / seconds, done / seconds


def topic_rates(
    before: StatusSnapshot | None, after: StatusSnapshot
) -> dict[str, tuple[float, float]]:
    """By topic, the :func:`rates` in and out between two snapshots (none without ``before``)."""
    if before is None:
        return {}
    seconds = (after.at - before.at) / 1000
    earlier = {t.topic: t for t in before.topics}
    return {
        t.topic: rates(earlier[t.topic], t, seconds) for t in after.topics if t.topic in earlier
    }


def _schedules(settings: Settings, timeout: float) -> tuple[ScheduleDue, ...]:
    schedules = read_schedules(settings, timeout)
    if not schedules:
        return ()
    last_fires = read_last_fires(settings, timeout)
    due = []
    for name, schedule in sorted(schedules.items()):
        last = last_fires.get(name)
        after = count_from(schedule, last)
        try:
            following: int | None = next_fire_ms(schedule.cron, schedule.timezone, after)
        except (ConfigurationError, ValueError):
            # Valid when written (a fire within 10 years of then), it may have none within 10
            # years of its last fire: the scheduler skips it as invalid too (a year field).
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


def read_status(
    settings: Settings, *, timeout: float = 30.0, reader: BacklogReader | None = None
) -> StatusSnapshot:
    """Read one :class:`StatusSnapshot` of ``settings.namespace``; ``reader`` (kept between
    refreshes by ``--watch``) reads the backlog, else one is opened for this read.

    Raises :class:`KafkaUnavailableError` when Kafka does not answer within ``timeout``
    seconds and :class:`TopicMissingError` when the namespace's topics do not exist.
    Nothing is written and no group is joined.
    """
    deadline = time.monotonic() + timeout
    if reader is None:
        with BacklogReader(settings, timeout=timeout) as own:
            backlog = own.read()
    else:
        backlog = reader.read()
    return StatusSnapshot(
        namespace=settings.namespace,
        at=int(backlog.read_at * 1000),
        priorities=tuple(backlog.jobs.values()),
        retry_tiers=backlog.retries,
        deferred=backlog.deferred,
        workers=backlog.groups["worker"],
        scheduler=backlog.groups["scheduler"],
        dead_letters_pending=backlog.dead_letters_pending,
        schedules=_schedules(settings, max(0.1, deadline - time.monotonic())),
        worker_beats=read_process_beats(settings, timeout=max(0.1, deadline - time.monotonic())),
    )
