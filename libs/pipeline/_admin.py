"""Declarative, idempotent topic management (DESIGN section 3): the calls to the cluster.

:func:`apply_topics` makes the cluster match the specs of :mod:`pipeline._topicspec` (which also
holds the pure spec-vs-cluster diff, re-exported here) and :func:`describe_topics` reports what
the cluster has, each through one :class:`~._adminsession.AdminSession`. ``apply_topics`` only
ever grows partitions and sets the configs listed in a spec; it never deletes, shrinks or
touches other configs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._adminsession import AdminSession, PartitionOffsets
from ._errors import TopicAdminError
from ._groupadmin import group_config_changes
from ._topicspec import (
    ApplyReport,
    Change,
    ChangeAction,
    ObservedTopic,
    TopicPlan,
    TopicSpec,
    copartitioned,
    plan_topic,
    topic_specs,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from ._settings import Settings

__all__ = [
    "ApplyReport",
    "Change",
    "ChangeAction",
    "ObservedTopic",
    "PartitionOffsets",
    "TopicAdminError",
    "TopicDescription",
    "TopicPlan",
    "TopicSpec",
    "apply_topics",
    "copartitioned",
    "describe_topics",
    "plan_topic",
    "topic_specs",
]

_log = logging.getLogger("pipeline.kafka.admin")


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """A spec'd topic as the cluster has it; ``exists`` is False (and counts 0) if missing."""

    spec: TopicSpec
    exists: bool
    partitions: int = 0
    replication_factor: int = 0
    configs: Mapping[str, str] = field(default_factory=dict, hash=False)
    offsets: tuple[PartitionOffsets, ...] = ()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def messages(self) -> int:
        """An estimate: end minus start offsets (transaction markers count too)."""
        return sum(p.messages for p in self.offsets)


def _check_brokers(plans: Iterable[TopicPlan], brokers: int) -> None:
    for plan in plans:
        rf = plan.spec.replication_factor
        if plan.create and rf > brokers:
            raise TopicAdminError(
                plan.spec.name,
                f"cannot create topic {plan.spec.name}: replication factor {rf} is larger than "
                f"the {brokers} available broker(s); lower topics.replication_factor "
                "(PIPELINE_TOPICS__REPLICATION_FACTOR) or add brokers",
            )


def apply_topics(
    settings: Settings,
    *,
    dry_run: bool = False,
    timeout: float = 30,
    allow_retention_decrease: bool = False,
) -> ApplyReport:
    """Create missing topics, grow partitions and set managed configs, and the group configs
    of the workers' groups under the consumer group protocol; return what changed.

    A ``retention.ms`` shorter than a topic has is a warning and left as it is (Kafka would
    delete the jobs or dead letters older than it), unless ``allow_retention_decrease``.

    With ``dry_run`` the broker validates every change (``validate_only``) and nothing changes.
    ``timeout`` bounds the whole operation, including the wait until new partitions have
    leaders and new configs are visible, so that a producer can use the topics right away.
    """
    session = AdminSession(settings, timeout)
    metadata = session.metadata()
    observed = session.observe(metadata, topic_specs(settings))
    specs = copartitioned(topic_specs(settings), observed, settings.namespace)
    plans = [
        plan_topic(spec, observed.get(spec.name), allow_retention_decrease=allow_retention_decrease)
        for spec in specs
    ]
    _check_brokers(plans, len(metadata.brokers))

    to_create = [p.spec for p in plans if p.create]
    to_grow = {p.spec.name: p.grow_to for p in plans if p.grow_to is not None}
    to_alter = {p.spec.name: p.set_configs for p in plans if p.set_configs}
    if to_create:
        session.create(to_create, validate_only=dry_run)
    if to_grow:
        session.grow(to_grow, validate_only=dry_run)
    if to_alter:
        session.alter(to_alter, validate_only=dry_run)
    if not dry_run:
        if to_create or to_grow:
            session.wait_ready({s.name: s.partitions for s in to_create} | to_grow)
        if to_alter:
            session.wait_configs(to_alter)
    groups = group_config_changes(session, dry_run=dry_run)
    report = ApplyReport((*(c for p in plans for c in p.changes), *groups), dry_run=dry_run)
    _log.info("topics apply: %s", report.summary())
    return report


def describe_topics(settings: Settings, timeout: float = 30) -> list[TopicDescription]:
    """Every spec'd topic as it is: existence, counts, configs and offsets."""
    specs = topic_specs(settings)
    session = AdminSession(settings, timeout)
    metadata = session.metadata()
    observed = session.observe(metadata, specs)
    offsets = session.offsets(metadata, observed)
    descriptions = []
    for spec in specs:
        seen = observed.get(spec.name)
        if seen is None:
            descriptions.append(TopicDescription(spec, exists=False))
        else:
            descriptions.append(
                TopicDescription(
                    spec,
                    exists=True,
                    partitions=seen.partitions,
                    replication_factor=seen.replication_factor,
                    configs=seen.configs,
                    offsets=offsets.get(spec.name, ()),
                )
            )
    return descriptions
