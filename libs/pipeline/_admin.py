"""Declarative, idempotent topic management (DESIGN section 3).

:func:`topic_specs` says what the topics of a namespace should look like, :func:`plan_topic`
compares one spec with what the cluster has (pure, no Kafka), and :func:`apply_topics` /
:func:`describe_topics` talk to the cluster. ``apply_topics`` only ever grows partitions and sets
the configs listed in a spec; it never deletes, shrinks or touches other configs.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourceType,
)

from ._errors import ConfigurationError, KafkaUnavailableError, PipelineError
from ._job import Priority
from ._topics import TopicNames

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
        ClusterMetadata,
    )

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
    "describe_topics",
    "plan_topic",
    "topic_specs",
]

_log = logging.getLogger("pipeline.kafka.admin")

HOUR_MS = 3600 * 1000
MIN_INSYNC = "min.insync.replicas"
# Shown by ``describe`` even where a spec does not manage them.
DISPLAYED_CONFIGS = ("cleanup.policy", "retention.ms", MIN_INSYNC)

_EARLIEST = OffsetSpec.earliest()  # type: ignore[no-untyped-call, unused-ignore]
_LATEST = OffsetSpec.latest()  # type: ignore[no-untyped-call, unused-ignore]
_UNAVAILABLE_CODES = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
    }
)
# Errors of a partition or config that is still settling after a change; worth another try.
_TRANSIENT = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
)


class TopicAdminError(PipelineError):
    """Kafka refused a topic operation (policy, authorization, replication, invalid config)."""

    def __init__(self, topic: str | None, message: str) -> None:
        super().__init__(message)
        self.topic = topic


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """How one topic should look. ``configs`` holds only the keys ``apply`` manages."""

    name: str
    partitions: int
    replication_factor: int
    configs: Mapping[str, str] = field(default_factory=dict, hash=False)
    purpose: str = ""


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
            log(t.jobs_retention_ms),
            f"retry tier {tier} (delay {delay:g}s)",
        )
        for tier, delay in enumerate(t.retry_delays_s)
    )
    specs += [
        TopicSpec(names.dlq, t.partitions, rf, log(t.dlq_retention_ms), "dead letters"),
        TopicSpec(names.schedules, 1, rf, dict(table), "cron schedules, by name"),
        TopicSpec(names.scheduler_state, 1, rf, dict(table), "scheduler progress"),
        TopicSpec(
            names.events,
            t.events_partitions,
            rf,
            log(t.events_retention_ms),
            "job lifecycle events",
        ),
    ]
    return specs


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


def plan_topic(spec: TopicSpec, observed: ObservedTopic | None) -> TopicPlan:
    """Compare a spec with the observed topic (``None``: it does not exist)."""
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
            on = len({c.topic for c in configs})
            parts.append(f"{verb} {_plural(len(configs), 'setting')} on {_plural(on, 'topic')}")
        text = ", ".join(parts) if parts else "nothing to change"
        if self.warnings:
            text += f"; {_plural(len(self.warnings), 'warning')}"
        if self.dry_run and parts:
            text += " (dry run: nothing was changed)"
        return text


_MUTATIONS = frozenset({ChangeAction.CREATED, ChangeAction.PARTITIONS, ChangeAction.CONFIG})


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    partition: int
    start: int
    end: int

    @property
    def messages(self) -> int:
        return max(0, self.end - self.start)


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


# --- talking to Kafka ---------------------------------------------------------------------

T = TypeVar("T")


class _NotVisibleError(Exception):
    """A change Kafka accepted is not visible yet; the message says what is awaited."""


class _ClientLog:
    """librdkafka's log lines, kept at DEBUG; the last problem explains a failure's cause."""

    def __init__(self) -> None:
        self.last_problem: str | None = None

    def log(self, level: int, fmt: str, *args: object) -> None:
        text = fmt % args
        if level >= logging.WARNING and args:
            # "[thrd:host:9092/bootstrap]: host:9092/bootstrap: Connect to ... failed: ..."
            self.last_problem = re.sub(r"^\[thrd:[^\]]*\]: ", "", str(args[-1]))
        _log.debug("%s", text)


class _Session:
    """One AdminClient plus one deadline shared by every call of an operation."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        self.settings = settings
        self.timeout = timeout
        self._end = time.monotonic() + timeout
        conf: dict[str, str | int | float | bool] = {**settings.client_config()}
        self._client_log = _ClientLog()
        try:
            self.client = AdminClient(conf, logger=self._client_log)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else exc
            reason = err.str() if isinstance(err, KafkaError) else str(err)
            raise ConfigurationError(f"invalid Kafka client settings: {reason}") from exc

    def remaining(self) -> float:
        return max(0.1, self._end - time.monotonic())

    def unavailable(self, reason: object) -> KafkaUnavailableError:
        self.client.poll(0)  # collect the client's log lines, which name the actual cause
        if self._client_log.last_problem:
            reason = f"{reason}; {self._client_log.last_problem}"
        return KafkaUnavailableError(
            f"Kafka at {self.settings.bootstrap_servers} did not answer within "
            f"{self.timeout:g}s ({reason}); is Kafka running? start one with `pipeline dev up`, "
            "or point PIPELINE_BOOTSTRAP_SERVERS at your cluster"
        )

    def error(self, exc: KafkaException, doing: str, topic: str | None) -> PipelineError:
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError):
            return TopicAdminError(topic, f"Kafka failed to {doing}: {exc}")
        if err.code() in _UNAVAILABLE_CODES:
            return self.unavailable(err.str())
        where = f" topic {topic}" if topic else ""
        return TopicAdminError(
            topic, f"Kafka refused to {doing}{where}: {err.str()} ({err.name()})"
        )

    def result(self, future: concurrent.futures.Future[Any], doing: str, topic: str | None) -> Any:
        try:
            return future.result(timeout=self.remaining() + 1.0)
        except concurrent.futures.TimeoutError as exc:
            raise self.unavailable(f"no answer to {doing}") from exc
        except KafkaException as exc:
            raise self.error(exc, doing, topic) from exc
        finally:
            self.client.poll(0)  # hand librdkafka's log lines to the logging module

    def retry(self, attempt: Callable[[], T]) -> T:
        """Repeat ``attempt`` while it fails transiently (leader moving, change propagating).

        KRaft applies a change on the brokers a little after the controller accepted it, so a
        created partition or a new config value can be invisible for some milliseconds.
        """
        pause = 0.02
        while True:
            try:
                return attempt()
            except (_NotVisibleError, TopicAdminError) as exc:
                if isinstance(exc, TopicAdminError) and not _has_code(exc.__cause__, *_TRANSIENT):
                    raise
                if time.monotonic() + pause >= self._end:
                    if isinstance(exc, TopicAdminError):
                        raise
                    raise KafkaUnavailableError(
                        f"{exc} on {self.settings.bootstrap_servers} after {self.timeout:g}s; "
                        "check the brokers' health, then run `pipeline topics apply` again"
                    ) from exc
            threading.Event().wait(pause)  # a bounded back-off between polls
            pause = min(pause * 2, 0.5)

    def metadata(self) -> ClusterMetadata:
        try:
            # No topic argument: asking for a named topic may auto-create it on some brokers.
            return self.client.list_topics(timeout=self.remaining())
        except KafkaException as exc:
            raise self.error(exc, "list topics", None) from exc
        finally:
            self.client.poll(0)

    def configs(self, keys: Mapping[str, Iterable[str]]) -> dict[str, dict[str, str]]:
        """Current values of ``keys[topic]`` for each topic (defaults included)."""
        if not keys:
            return {}
        resources = [ConfigResource(ResourceType.TOPIC, name) for name in keys]
        futures = self.client.describe_configs(resources, request_timeout=self.remaining())
        found = {}
        for resource, future in futures.items():
            entries = self.result(future, "describe configs of", resource.name)
            wanted = set(keys[resource.name])
            found[resource.name] = {k: e.value for k, e in entries.items() if k in wanted}
        return found

    def observe(
        self, metadata: ClusterMetadata, specs: Iterable[TopicSpec]
    ) -> dict[str, ObservedTopic]:
        keys = {
            s.name: [*s.configs, *DISPLAYED_CONFIGS] for s in specs if _exists(metadata, s.name)
        }
        observed = {}
        for name, configs in self.retry(lambda: self.configs(keys)).items():
            partitions = metadata.topics[name].partitions.values()
            observed[name] = ObservedTopic(
                name,
                partitions=len(partitions),
                replication_factor=min((len(p.replicas) for p in partitions), default=0),
                configs=configs,
            )
        return observed

    def create(self, specs: Sequence[TopicSpec], *, validate_only: bool) -> None:
        new = [
            NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.configs))
            for s in specs
        ]
        futures = self.client.create_topics(
            new,
            operation_timeout=self.remaining(),
            request_timeout=self.remaining(),
            validate_only=validate_only,
        )
        for name, future in futures.items():
            try:
                self.result(future, "create", name)
            except TopicAdminError as exc:
                # Created meanwhile by a concurrent apply: fine, the next apply reconciles it.
                if not _has_code(exc.__cause__, KafkaError.TOPIC_ALREADY_EXISTS):
                    raise

    def grow(self, counts: Mapping[str, int], *, validate_only: bool) -> None:
        new = [NewPartitions(name, total) for name, total in counts.items()]
        futures = self.client.create_partitions(
            new,
            operation_timeout=self.remaining(),
            request_timeout=self.remaining(),
            validate_only=validate_only,
        )
        for name, future in futures.items():
            self.result(future, "add partitions to", name)

    def alter(self, configs: Mapping[str, Mapping[str, str]], *, validate_only: bool) -> None:
        resources = [
            ConfigResource(
                ResourceType.TOPIC,
                name,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in values.items()
                ],
            )
            for name, values in configs.items()
        ]
        futures = self.client.incremental_alter_configs(
            resources, request_timeout=self.remaining(), validate_only=validate_only
        )
        for resource, future in futures.items():
            self.result(future, "change configs of", resource.name)

    def wait_configs(self, configs: Mapping[str, Mapping[str, str]]) -> None:
        """Return once every broker answer shows the new config values."""

        def check() -> None:
            current = self.configs(configs)
            for name, values in configs.items():
                for key, value in values.items():
                    if not _same_value(current[name].get(key), value):
                        raise _NotVisibleError(
                            f"{key} of topic {name} still is {current[name].get(key)}"
                        )

        self.retry(check)

    def wait_ready(self, partitions: Mapping[str, int]) -> None:
        """Return once every partition has a leader that answers, so producing works at once."""

        def check() -> None:
            metadata = self.metadata()
            for name, count in partitions.items():
                if not _ready(metadata, name, count):
                    raise _NotVisibleError(f"topic {name} has partitions without a leader")
            self.end_offsets(metadata, partitions)  # leaders answer (or raise NOT_LEADER, retried)

        self.retry(check)

    def end_offsets(self, metadata: ClusterMetadata, names: Iterable[str]) -> dict[str, list[int]]:
        return self._offsets(metadata, names, _LATEST)

    def _offsets(
        self, metadata: ClusterMetadata, names: Iterable[str], which: Any
    ) -> dict[str, list[int]]:
        tps = [TopicPartition(n, p) for n in names for p in sorted(metadata.topics[n].partitions)]
        if not tps:
            return {}
        futures = self.client.list_offsets(
            {tp: which for tp in tps}, request_timeout=self.remaining()
        )
        found: dict[str, dict[int, int]] = {}
        for tp, future in futures.items():
            info = self.result(future, "list offsets of", tp.topic)
            found.setdefault(tp.topic, {})[tp.partition] = info.offset
        return {name: [found[name][p] for p in sorted(found[name])] for name in found}

    def offsets(
        self, metadata: ClusterMetadata, names: Iterable[str]
    ) -> dict[str, tuple[PartitionOffsets, ...]]:
        names = list(names)
        starts = self.retry(lambda: self._offsets(metadata, names, _EARLIEST))
        ends = self.retry(lambda: self._offsets(metadata, names, _LATEST))
        return {
            name: tuple(
                PartitionOffsets(p, start, end)
                for p, (start, end) in enumerate(zip(starts[name], ends[name], strict=True))
            )
            for name in starts
        }


def _has_code(exc: BaseException | None, *codes: int) -> bool:
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    err = exc.args[0]
    return isinstance(err, KafkaError) and err.code() in codes


def _exists(metadata: ClusterMetadata, name: str) -> bool:
    topic = metadata.topics.get(name)
    return topic is not None and not (
        topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    )


def _ready(metadata: ClusterMetadata, name: str, partitions: int) -> bool:
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None or len(topic.partitions) < partitions:
        return False
    return all(p.leader >= 0 and p.error is None for p in topic.partitions.values())


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


def apply_topics(settings: Settings, *, dry_run: bool = False, timeout: float = 30) -> ApplyReport:
    """Create missing topics, grow partitions and set managed configs; return what changed.

    With ``dry_run`` the broker validates every change (``validate_only``) and nothing changes.
    ``timeout`` bounds the whole operation, including the wait until new partitions have
    leaders and new configs are visible, so that a producer can use the topics right away.
    """
    specs = topic_specs(settings)
    session = _Session(settings, timeout)
    metadata = session.metadata()
    observed = session.observe(metadata, specs)
    plans = [plan_topic(spec, observed.get(spec.name)) for spec in specs]
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
    report = ApplyReport(tuple(c for p in plans for c in p.changes), dry_run=dry_run)
    _log.info("topics apply: %s", report.summary())
    return report


def describe_topics(settings: Settings, timeout: float = 30) -> list[TopicDescription]:
    """Every spec'd topic as it is: existence, counts, configs and offsets."""
    specs = topic_specs(settings)
    session = _Session(settings, timeout)
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
