"""The least-privilege ACLs of each role of a namespace (docs/security.md has the table).

Pure functions: :func:`plan_acls` says which bindings a principal of a role needs, derived from
what each process does on the cluster (which topics it reads and writes, which consumer
groups it joins or describes, which transactional ids it uses). Applying them is
:mod:`pipeline._aclapply`. :func:`written_topics` names the topics a role's bindings allow to
write, which a starting worker or scheduler checks it may (:mod:`pipeline._writecheck`).

Topics come one literal name at a time, or by prefix for a family (``<ns>.jobs.``,
``<ns>.retry.``, ``<ns>.deferred.``), so that no role gets a topic it does not touch. Read,
Write and the other operations imply Describe on the same resource (Kafka's rule), so a role
gets Describe alone only where it describes and does nothing else. No role needs
IdempotentWrite on the cluster: since Kafka 3.0 (KIP-679) Write on a topic is enough for an
idempotent producer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ._deadletters import dlq_transactional_id
from ._topics import (
    TopicNames,
    deferred_group,
    former_retry_group,
    retry_group,
    scheduler_group,
    worker_group,
)
from ._topicspec import scheduler_control_topic, topic_specs

if TYPE_CHECKING:
    from ._settings import Settings


class Role(StrEnum):
    PRODUCER = "producer"
    WORKER = "worker"
    SCHEDULER = "scheduler"
    OPERATOR = "operator"
    ADMIN = "admin"


class ResourceKind(StrEnum):
    """Kafka's ACL resource types (names as confluent-kafka's ``ResourceType``)."""

    TOPIC = "TOPIC"
    GROUP = "GROUP"
    TRANSACTIONAL_ID = "TRANSACTIONAL_ID"


class PatternKind(StrEnum):
    LITERAL = "LITERAL"
    PREFIXED = "PREFIXED"


class Operation(StrEnum):
    """Kafka's ACL operations (names as confluent-kafka's ``AclOperation``)."""

    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DESCRIBE = "DESCRIBE"
    ALTER = "ALTER"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"


@dataclass(frozen=True, slots=True, order=True)
class AclRule:
    """One ALLOW binding: ``principal`` may do ``operation`` on the resource, from any host.

    ``why`` says what needs it; it is no part of the binding (equality ignores it).
    """

    resource: ResourceKind
    pattern: PatternKind
    name: str
    operation: Operation
    principal: str
    host: str = "*"
    why: str = field(default="", compare=False)

    def describe(self) -> str:
        """``TOPIC ns.jobs.* WRITE`` (a prefixed name ends with ``*``)."""
        star = "*" if self.pattern is PatternKind.PREFIXED else ""
        return f"{self.resource.value} {self.name}{star} {self.operation.value}"

    def as_json(self) -> dict[str, Any]:
        return {key: str(value) for key, value in asdict(self).items()}


_Row = tuple[ResourceKind, PatternKind, str, tuple[Operation, ...], str]
"""A resource, its pattern, its name, the operations allowed on it and why."""


def _rules(principal: str, rows: list[_Row]) -> list[AclRule]:
    found: dict[AclRule, AclRule] = {}
    for resource, pattern, name, operations, why in rows:
        for operation in operations:
            rule = AclRule(resource, pattern, name, operation, principal, why=why)
            found.setdefault(rule, rule)
    return sorted(found)


_T, _G, _X = ResourceKind.TOPIC, ResourceKind.GROUP, ResourceKind.TRANSACTIONAL_ID
_LIT, _PRE = PatternKind.LITERAL, PatternKind.PREFIXED
_R, _W, _D = Operation.READ, Operation.WRITE, Operation.DESCRIBE


def plan_acls(role: Role | str, principal: str, settings: Settings) -> list[AclRule]:
    """The bindings ``principal`` needs to act as ``role`` in ``settings.namespace``, sorted.

    Group and transactional ids follow ``settings`` (``worker.group_id``,
    ``scheduler.group_id``, ``scheduler.transactional_id``), as the processes do.
    """
    if not principal.startswith("User:") or principal == "User:":
        raise ValueError(f"a principal is 'User:<name>', not {principal!r}")
    ns = settings.namespace
    t = TopicNames(ns)
    jobs = f"{ns}.jobs."
    role = Role(role)
    rows: list[_Row]
    if role is Role.PRODUCER:
        rows = [
            (_T, _PRE, jobs, (_W,), "enqueue: a ready job goes to its priority's topic"),
            (_T, _LIT, t.deferred, (_W,), "enqueue with a delay or run_at"),
        ]
    elif role is Role.WORKER:
        rows = [
            (_T, _PRE, jobs, (_R, _W), "run jobs; the retry relay moves due retries back"),
            (_T, _PRE, f"{ns}.retry.", (_R, _W), "retry tiers: failed jobs, and the relay"),
            (_T, _LIT, t.deferred, (_W,), "a retry with a delay of the job type's own"),
            (_T, _LIT, t.dlq, (_W,), "dead letters"),
            (_T, _LIT, t.events, (_W,), "job lifecycle events"),
            (_T, _LIT, t.dedup, (_R, _W), "idempotency keys: written, restored at assignment"),
            (_T, _LIT, t.workers, (_W,), "the process's heartbeats"),
            (_G, _LIT, worker_group(settings), (_R,), "the workers' group, offsets in txns"),
            *[
                (_G, _LIT, g, (Operation.DESCRIBE_CONFIGS,), "its timings, checked at start")
                for g in (worker_group(settings), retry_group(settings))
            ],
            (_G, _LIT, retry_group(settings), (_R,), "the retry relays' group, one per namespace"),
            *[
                (_G, _LIT, g, (_D,), "the relay's group before: its offsets are taken over")
                for g in filter(None, [former_retry_group(settings)])
            ],
            (_G, _LIT, f"{t.dedup}.restore", (_D,), "restoring keys: their reader's coordinator"),
            (_X, _PRE, f"{ns}.worker.", (_W,), "the moves producer, one id per process"),
            (_X, _PRE, f"{ns}.relay.", (_W,), "the retry relay's producer, one id per process"),
        ]
    elif role is Role.SCHEDULER:
        txn = settings.scheduler.transactional_id or f"{ns}.scheduler"
        rows = [
            (_T, _LIT, t.deferred, (_R,), "delayed jobs, held until due"),
            (_T, _PRE, f"{t.deferred}.", (_R, _W), "the wait tiers"),
            (_T, _PRE, jobs, (_W,), "due jobs and cron fires"),
            (_T, _LIT, t.dlq, (_W,), "undecodable deferred records"),
            (_T, _LIT, t.schedules, (_R, _W), "cron schedules; code-registered ones published"),
            (_T, _LIT, t.scheduler_state, (_R, _W), "last fires and progress, for takeover"),
            (_T, _LIT, scheduler_control_topic(ns), (_R,), "leadership (one member leads)"),
            (_G, _LIT, scheduler_group(settings), (_R,), "the leadership group"),
            (_G, _LIT, deferred_group(settings), (_R,), "the leader's deferred consumer"),
            (
                _G,
                _LIT,
                f"{ns}.table-reader",
                (_D,),
                "schedules from code: their reader's coordinator",
            ),
            (_X, _LIT, txn, (_W,), "the leader's transactions (fencing of a former leader)"),
        ]
    elif role is Role.OPERATOR:
        groups = (worker_group(settings), retry_group(settings))
        rows = [
            (_T, _PRE, f"{ns}.", (_R,), "status, dlq list/show, events, schedules, the dashboard"),
            (_T, _PRE, f"{ns}.", (Operation.DESCRIBE_CONFIGS,), "`pipeline topics` shows them"),
            (_T, _PRE, jobs, (_W,), "dlq replay, schedules trigger"),
            *[
                (_T, pattern, name, (_W,), "dlq replay: undecodable bytes go back where they were")
                for pattern, name in (
                    (_PRE, f"{ns}.retry."),
                    (_LIT, t.deferred),
                    (_PRE, f"{t.deferred}."),
                )
            ],
            (_T, _LIT, t.dlq_state, (_W,), "dlq replay/discard record what was done"),
            (_T, _LIT, t.events, (_W,), "dlq replay/discard write an event per job"),
            (_T, _LIT, t.schedules, (_W,), "schedules add/pause/resume/remove"),
            *[(_G, _LIT, g, (_D,), "status: the workers' lag and members") for g in groups],
            (_G, _LIT, deferred_group(settings), (_D,), "status: the scheduler's progress"),
            (_G, _LIT, scheduler_group(settings), (_D,), "status: the scheduler's members"),
            (_G, _LIT, f"{ns}.dlq-reader", (_D,), "dlq commands: their reader's coordinator"),
            (_G, _LIT, f"{ns}.backlog-reader", (_D,), "status: its reader's coordinator"),
            (_G, _LIT, f"{ns}.table-reader", (_D,), "schedules: their reader's coordinator"),
            (_X, _LIT, dlq_transactional_id(ns), (_W,), "dlq replay/discard transactions"),
        ]
    else:
        rows = [
            (_T, _PRE, f"{ns}.", (Operation.CREATE,), "`pipeline topics apply` creates topics"),
            (_T, _PRE, f"{ns}.", (Operation.ALTER,), "topics apply adds partitions"),
            (_T, _PRE, f"{ns}.", (Operation.ALTER_CONFIGS,), "topics apply sets configs"),
            *[
                (_G, _LIT, g, (Operation.ALTER_CONFIGS,), "topics apply sets group timings")
                for g in (worker_group(settings), retry_group(settings))
            ],
        ]
    return _rules(principal, rows)


def written_topics(role: Role | str, settings: Settings) -> list[str]:
    """The topics of ``settings.namespace`` that ``role``'s bindings allow to write: each topic
    ``pipeline topics apply`` makes that a WRITE rule of :func:`plan_acls` names, or whose name
    starts with one of its prefixes, in the order of :func:`~pipeline._topicspec.topic_specs`
    (the retry and wait tiers of ``settings``)."""
    writes = [
        rule
        for rule in plan_acls(role, "User:-", settings)
        if rule.resource is ResourceKind.TOPIC and rule.operation is Operation.WRITE
    ]
    return [
        spec.name for spec in topic_specs(settings) if any(_names(r, spec.name) for r in writes)
    ]


def _names(rule: AclRule, topic: str) -> bool:
    """Whether ``rule``'s resource name covers ``topic`` (Kafka's literal and prefixed match)."""
    if rule.pattern is PatternKind.PREFIXED:
        return topic.startswith(rule.name)
    return topic == rule.name
