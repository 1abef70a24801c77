"""What the topics of a namespace should look like, and what ``apply`` would change: no Kafka.

:func:`topic_specs` declares the topics (DESIGN section 3), :func:`plan_topic` compares one spec
with what the cluster has, and :class:`ApplyReport` sums the changes up. The calls to the cluster
are in :mod:`pipeline._admin`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from ._job import Priority
from ._topics import TopicNames

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._settings import Settings

__all__ = [
    "ApplyReport",
    "Change",
    "ChangeAction",
    "ObservedTopic",
    "TopicPlan",
    "TopicSpec",
    "deferred_tier_topic",
    "plan_topic",
    "scheduler_control_topic",
    "topic_specs",
]

HOUR_MS = 3600 * 1000
DAY_MS = 24 * HOUR_MS
MIN_INSYNC = "min.insync.replicas"
RETENTION = "retention.ms"
GROUP_ROW = "group "
"""How a consumer group's row of an apply is named: ``group <id>`` (see ``_groupadmin``)."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How one topic should look. ``configs`` holds only the keys ``apply`` manages."""

    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict, hash=False)
    purpose: str = ""


def deferred_tier_topic(namespace: str, tier: int) -> str:
    """Wait tier ``tier`` (from 0) of the scheduler: one fixed delay per topic."""
    return f"{namespace}.deferred.{tier}"


def scheduler_control_topic(namespace: str) -> str:
    """The one-partition topic whose owner in the scheduler group is the leader."""
    return f"{namespace}.scheduler-control"


def _keys(table: dict[str, str], settings: Settings) -> dict[str, str]:
    """The configs of ``<ns>.dedup``: a table topic whose tombstones (one per expired key) go
    after an hour, not Kafka's default day. A restore reads every tombstone still there, so at
    a steady rate of new keys a day of them would make it read 24 times more than an hour of
    them (minutes, past the restore's timeout, at a few hundred new keys a second). A reader
    must read to the end within this time not to miss one (Kafka's rule for a compacted topic):
    a restore gives up after ``dedup_restore_timeout_s``, so this is at least twice that."""
    restore_ms = int(2 * settings.worker.dedup_restore_timeout_s * 1000)
    return {**table, "delete.retention.ms": str(max(HOUR_MS, restore_ms))}


def _waiting(retention_ms: int, delay_s: float) -> int:
    """The retention of a topic whose jobs wait ``delay_s`` before they are due: the job
    topics' retention from then on. Kafka counts it from when a job was written, and a tier
    whose delay outlasted it (a 6 h wait tier, 1 h of retention) lost its jobs before they were
    due. -1: forever."""
    if retention_ms < 0:
        return retention_ms
    return retention_ms + math.ceil(delay_s * 1000)


def topic_specs(settings: Settings) -> list[TopicSpec]:
    """Every topic of ``settings.namespace``, in a stable order. Extend here for new topics."""
    t = settings.topics
    names = TopicNames(settings.namespace)
    rf = t.replication_factor
    common = {
        MIN_INSYNC: str(t.effective_min_insync_replicas),
        "message.timestamp.type": "CreateTime",
    }

    def log(retention_ms: int) -> dict[str, str]:
        return {"cleanup.policy": "delete", "retention.ms": str(retention_ms), **common}

    # A table topic: compact often (small, hot keys) so a reader catching up reads little.
    table = {
        "cleanup.policy": "compact",
        "segment.ms": str(HOUR_MS),
        "min.cleanable.dirty.ratio": "0.1",
        **common,
    }
    specs = [
        TopicSpec(names.jobs(p), t.partitions, rf, log(t.jobs_retention_ms), f"{p.value} jobs")
        for p in Priority
    ]
    specs.append(
        TopicSpec(names.deferred, t.partitions, rf, log(t.jobs_retention_ms), "jobs due later")
    )
    specs.extend(
        TopicSpec(
            names.retry(tier),
            t.partitions,
            rf,
            log(_waiting(t.jobs_retention_ms, delay)),
            f"retry tier {tier} (delay {delay:g}s)",
        )
        for tier, delay in enumerate(t.retry_delays_s)
    )
    specs.extend(
        TopicSpec(
            deferred_tier_topic(settings.namespace, tier),
            t.partitions,
            rf,
            log(_waiting(t.jobs_retention_ms, delay)),
            f"scheduler wait tier {tier} (delay {delay:g}s)",
        )
        for tier, delay in enumerate(settings.scheduler.wait_tiers_s)
    )
    specs += [
        TopicSpec(
            scheduler_control_topic(settings.namespace),
            1,
            rf,
            log(HOUR_MS),
            "scheduler leadership (never written)",
        ),
        TopicSpec(names.dlq, t.partitions, rf, log(t.dlq_retention_ms), "dead letters"),
        TopicSpec(
            names.dlq_state,
            1,
            rf,
            # Compacted, and deleted with the dead letters: a letter's state is written after
            # it, so it goes after it; nothing else ever removed the states of letters gone.
            {**table, "cleanup.policy": "compact,delete", "retention.ms": str(t.dlq_retention_ms)},
            "dead letters replayed or discarded",
        ),
        TopicSpec(
            names.dedup, t.partitions, rf, _keys(table, settings), "idempotency keys seen, by key"
        ),
        TopicSpec(names.schedules, 1, rf, dict(table), "cron schedules, by name"),
        TopicSpec(names.scheduler_state, 1, rf, dict(table), "scheduler progress"),
        TopicSpec(
            names.events,
            t.events_partitions,
            rf,
            log(t.events_retention_ms),
            "job lifecycle events",
        ),
        TopicSpec(names.workers, 1, rf, _heartbeats(common), "worker heartbeats, by client id"),
    ]
    return specs


def _heartbeats(common: Mapping[str, str]) -> dict[str, str]:
    """``<ns>.workers``: a table that is rewritten every few seconds by every worker. Small
    segments (1 MiB or 10 minutes) keep what a reader reads beyond the compacted keys short;
    ``delete`` next to ``compact`` lets the last heartbeat of a worker that died without its
    tombstone go after a day (readers call it stale long before)."""
    return {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(DAY_MS),
        "segment.ms": str(10 * 60 * 1000),
        "segment.bytes": str(1024 * 1024),
        "min.cleanable.dirty.ratio": "0.1",
        **common,
    }


# --- planning: pure, no Kafka -------------------------------------------------------------


class ChangeAction(StrEnum):
    CREATED = "created"
    PARTITIONS = "partitions"
    CONFIG = "config"
    UNCHANGED = "unchanged"
    WARNING = "warning"


@dataclass(frozen=True, slots=True)
class Change:
    """One line of an apply report: what was (or, in a dry run, would be) done to a topic."""

    topic: str
    action: ChangeAction
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ObservedTopic:
    """What the cluster has for a topic: counts and the current values of the configs asked for."""

    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class TopicPlan:
    """What ``apply`` must do to make one topic match its spec."""

    spec: TopicSpec
    create: bool = False
    grow_to: int | None = None
    set_configs: Mapping[str, str] = field(default_factory=dict, hash=False)
    changes: tuple[Change, ...] = ()


def _same_value(current: str | None, wanted: str) -> bool:
    if current is None:
        return False
    try:
        return float(current) == float(wanted)  # "0.1" == "0.10"
    except ValueError:
        return current.strip() == wanted.strip()


def _shortens(current: str | None, wanted: str) -> bool:
    """Whether setting ``retention.ms`` from ``current`` to ``wanted`` shortens it (-1 is
    forever): Kafka then deletes the records older than the new retention."""
    try:
        now, then = int(current or ""), int(wanted)
    except ValueError:
        return False
    return then >= 0 and (now < 0 or then < now)


def copartitioned(
    specs: list[TopicSpec], observed: Mapping[str, ObservedTopic], namespace: str
) -> list[TopicSpec]:
    """``specs``, the priority topics and ``<ns>.dedup`` with as many partitions as the one of
    them that has the most (or the settings' count, if more).

    Partition p of every priority topic goes to one worker, and its idempotency keys live in
    partition p of ``<ns>.dedup``: they must have the same count. One grown apart (by another
    tool, or an earlier apply with more partitions) was left larger with a warning while the
    others, and a new ``<ns>.dedup``, got the settings' count, which no later apply mended.
    """
    names = TopicNames(namespace)
    group = {names.jobs(p) for p in Priority} | {names.dedup}
    wanted = max(
        [s.partitions for s in specs if s.name in group]
        + [observed[name].partitions for name in group if name in observed]
    )
    return [replace(s, partitions=wanted) if s.name in group else s for s in specs]


def plan_topic(
    spec: TopicSpec, observed: ObservedTopic | None, *, allow_retention_decrease: bool = False
) -> TopicPlan:
    """Compare a spec with the observed topic (``None``: it does not exist). A shorter
    ``retention.ms`` than the topic has is left, with a warning, unless
    ``allow_retention_decrease``: it would delete the jobs or dead letters older than it."""
    name = spec.name
    if observed is None:
        detail = (
            f"{_plural(spec.partitions, 'partition')}, replication factor {spec.replication_factor}"
        )
        return TopicPlan(spec, create=True, changes=(Change(name, ChangeAction.CREATED, detail),))
    changes: list[Change] = []
    grow_to = None
    if spec.partitions > observed.partitions:
        grow_to = spec.partitions
        detail = f"{observed.partitions} -> {spec.partitions}"
        changes.append(Change(name, ChangeAction.PARTITIONS, detail))
    elif spec.partitions < observed.partitions:
        detail = (
            f"cannot decrease partitions from {observed.partitions} to {spec.partitions}; "
            "left as it is"
        )
        changes.append(Change(name, ChangeAction.WARNING, detail))
    if spec.replication_factor != observed.replication_factor:
        detail = (
            f"replication factor is {observed.replication_factor}, the spec says "
            f"{spec.replication_factor}; changing it needs a partition reassignment "
            "(kafka-reassign-partitions.sh), which apply does not do"
        )
        changes.append(Change(name, ChangeAction.WARNING, detail))
    set_configs: dict[str, str] = {}
    for key, wanted in spec.configs.items():
        current = observed.configs.get(key)
        if _same_value(current, wanted):
            continue
        if key == MIN_INSYNC and int(wanted) > observed.replication_factor:
            detail = (
                f"{MIN_INSYNC} {wanted} exceeds the replication factor "
                f"{observed.replication_factor}, which would block every acks=all write; "
                f"left at {current}"
            )
            changes.append(Change(name, ChangeAction.WARNING, detail))
            continue
        if key == RETENTION and not allow_retention_decrease and _shortens(current, wanted):
            detail = (
                f"{RETENTION} {current} -> {wanted} would shorten the retention (Kafka would "
                "delete the records older than the new one); left as it is: "
                "`pipeline topics apply --allow-retention-decrease` applies it"
            )
            changes.append(Change(name, ChangeAction.WARNING, detail))
            continue
        set_configs[key] = wanted
        changes.append(Change(name, ChangeAction.CONFIG, f"{key} {current} -> {wanted}"))
    if not changes:
        changes.append(Change(name, ChangeAction.UNCHANGED))
    return TopicPlan(spec, grow_to=grow_to, set_configs=set_configs, changes=tuple(changes))


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class ApplyReport:
    """Everything ``apply_topics`` did (or would do, when ``dry_run``), topic by topic."""

    changes: tuple[Change, ...]
    dry_run: bool = False

    def of(self, action: ChangeAction) -> list[Change]:
        return [c for c in self.changes if c.action is action]

    @property
    def changed(self) -> bool:
        return any(c.action in _MUTATIONS for c in self.changes)

    @property
    def warnings(self) -> list[Change]:
        return self.of(ChangeAction.WARNING)

    def summary(self) -> str:
        """One line: ``created 11 topics``, ``nothing to change``, ..."""
        created = len(self.of(ChangeAction.CREATED))
        grown = len(self.of(ChangeAction.PARTITIONS))
        configs = self.of(ChangeAction.CONFIG)
        parts = []
        if created:
            parts.append(
                f"{'would create' if self.dry_run else 'created'} {_plural(created, 'topic')}"
            )
        if grown:
            verb = "would add" if self.dry_run else "added"
            parts.append(f"{verb} partitions to {_plural(grown, 'topic')}")
        if configs:
            verb = "would change" if self.dry_run else "changed"
            topics = {c.topic for c in configs if not c.topic.startswith(GROUP_ROW)}
            groups = {c.topic for c in configs} - topics
            on = " and ".join(
                _plural(len(names), noun)
                for names, noun in ((topics, "topic"), (groups, "group"))
                if names
            )
            parts.append(f"{verb} {_plural(len(configs), 'setting')} on {on}")
        text = ", ".join(parts) if parts else "nothing to change"
        if self.warnings:
            text += f"; {_plural(len(self.warnings), 'warning')}"
        if self.dry_run and parts:
            text += " (dry run: nothing was changed)"
        return text


_MUTATIONS = frozenset({ChangeAction.CREATED, ChangeAction.PARTITIONS, ChangeAction.CONFIG})
