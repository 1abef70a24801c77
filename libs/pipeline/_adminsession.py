"""One admin session with the cluster: an AdminClient, a deadline, and Kafka's errors made ours.

The topic operations of :mod:`pipeline._admin` are written against it: each call waits for its
futures within what is left of the deadline, retries what is still settling after a change
(a new partition without a leader yet, a config not visible yet), and turns librdkafka's errors
into :class:`KafkaUnavailableError` or :class:`TopicAdminError` naming the topic. A client
Kafka refuses (credentials, TLS) gets :class:`KafkaAuthenticationError` as soon as librdkafka
logs the refusal, not at the deadline.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicCollection, TopicPartition

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

from ._clientlog import LastProblemLog
from ._errors import (
    KafkaAuthenticationError,
    KafkaUnavailableError,
    PipelineError,
    TopicAdminError,
)
from ._newclient import client
from ._partitions import unavailable
from ._topicspec import MIN_INSYNC, ObservedTopic, TopicSpec, _same_value

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
        ClusterMetadata,
    )

    from ._settings import Settings

_log = logging.getLogger("pipeline.kafka.admin")

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
REFUSAL_CHECK_S = 0.25
"""How often a wait for an answer looks for a refusal among the client's log lines."""
# Errors of a partition or config that is still settling after a change; worth another try.
_TRANSIENT = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError.OFFSET_NOT_AVAILABLE,
    KafkaError.FENCED_LEADER_EPOCH,
    KafkaError.UNKNOWN_LEADER_EPOCH,
)


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    partition: int
    start: int
    end: int

    @property
    def messages(self) -> int:
        return max(0, self.end - self.start)


T = TypeVar("T")


class _NotVisibleError(Exception):
    """A change Kafka accepted is not visible yet; the message says what is awaited."""


class AdminSession:
    """One AdminClient plus one deadline shared by every call of an operation."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        self.settings = settings
        self.timeout = timeout
        self._end = time.monotonic() + timeout
        conf: dict[str, str | int | float | bool] = {**settings.client_config()}
        self._client_log = LastProblemLog()
        self.client = client(AdminClient, conf, logger=self._client_log)

    def remaining(self) -> float:
        return max(0.1, self._end - time.monotonic())

    def restart_deadline(self, timeout: float | None = None) -> None:
        """Give the next operation a whole ``timeout`` again (a session kept between reads),
        or the new ``timeout`` given."""
        if timeout is not None:
            self.timeout = timeout
        self._end = time.monotonic() + self.timeout

    def unavailable(self, reason: object) -> KafkaUnavailableError | KafkaAuthenticationError:
        return unavailable(self.client, self._client_log, self.settings, self.timeout, reason)

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

    def check_refused(self) -> None:
        """Raise :class:`KafkaAuthenticationError` if Kafka refused this client."""
        self.client.poll(0)
        refused = self._client_log.refused(self.settings)
        if refused is not None:
            raise refused

    def result(self, future: concurrent.futures.Future[Any], doing: str, topic: str | None) -> Any:
        end = time.monotonic() + self.remaining() + 1.0
        try:
            while True:  # in steps, to stop at a refusal rather than at the deadline
                try:
                    answer = future.result(timeout=min(REFUSAL_CHECK_S, end - time.monotonic()))
                except concurrent.futures.TimeoutError:
                    self.check_refused()
                    if time.monotonic() >= end:
                        raise
                else:
                    self._client_log.answered()
                    return answer
        except concurrent.futures.TimeoutError as exc:
            raise self.unavailable(f"no answer to {doing}") from exc
        except KafkaException as exc:
            raise self.error(exc, doing, topic) from exc
        finally:
            self.client.poll(0)  # hand librdkafka's log lines to the logging module

    def describe(
        self, topics: Sequence[str], *, operations: bool = False
    ) -> dict[str, Any | TopicAdminError]:
        """Each of ``topics`` as Kafka describes it (its id, KIP-516; with ``operations``,
        what this client may do with it, KIP-430), or the :class:`TopicAdminError` it gave
        for that topic (missing, not authorized). Raises :class:`KafkaUnavailableError` when
        Kafka does not answer in time."""
        if not topics:
            return {}
        futures = self.client.describe_topics(
            TopicCollection(list(topics)),
            request_timeout=self.remaining(),
            include_authorized_operations=operations,
        )
        described: dict[str, Any | TopicAdminError] = {}
        for topic in topics:
            try:
                described[topic] = self.result(futures[topic], "describe", topic)
            except TopicAdminError as exc:
                described[topic] = exc
        return described

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
                if isinstance(exc, TopicAdminError) and not has_code(exc.__cause__, *_TRANSIENT):
                    raise
                if time.monotonic() + pause >= self._end:
                    if isinstance(exc, TopicAdminError):
                        raise
                    raise KafkaUnavailableError(
                        f"{exc} on {self.settings.bootstrap_servers} after {self.timeout:g}s; "
                        "check the brokers' health, then run `pipeline topics apply` again"
                    ) from exc
            threading.Event().wait(pause)  # a bounded back-off between polls
            pause = min(pause * 2, 0.1)

    def metadata(self) -> ClusterMetadata:
        try:
            while True:  # in steps, to stop at a refusal rather than at the deadline
                step = min(self.remaining(), 1.0)
                try:
                    # No topic argument: asking for a named topic may auto-create it on some
                    # brokers.
                    metadata: ClusterMetadata = self.client.list_topics(timeout=step)
                except KafkaException as exc:
                    if not has_code(exc, KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
                        raise
                    self.check_refused()
                    if self.remaining() <= 0.1:
                        raise
                else:
                    self._client_log.answered()
                    return metadata
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
                if not has_code(exc.__cause__, KafkaError.TOPIC_ALREADY_EXISTS):
                    raise

    def grow(self, counts: Mapping[str, int], *, validate_only: bool) -> None:
        new = [NewPartitions(name, total) for name, total in counts.items()]
        futures = self.client.create_partitions(
            new,
            operation_timeout=self.remaining(),
            request_timeout=self.remaining(),
            validate_only=validate_only,
        )
        grown_meanwhile = []
        for name, future in futures.items():
            try:
                self.result(future, "add partitions to", name)
            except TopicAdminError as exc:
                if not has_code(exc.__cause__, KafkaError.INVALID_PARTITIONS):
                    raise
                grown_meanwhile.append((name, exc))
        if grown_meanwhile:
            # Grown to as many (or more) by a concurrent apply, Kafka says so: fine, as for a
            # topic created meanwhile. Fewer: the refusal is real (it names the count).
            metadata = self.metadata()
            for name, refusal in grown_meanwhile:
                topic = metadata.topics.get(name)
                if topic is None or len(topic.partitions) < counts[name]:
                    raise refusal

    def alter(self, configs: Mapping[str, Mapping[str, str]], *, validate_only: bool) -> None:
        resources = config_sets(ResourceType.TOPIC, configs)
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


def has_code(exc: BaseException | None, *codes: int) -> bool:
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


def config_sets(
    kind: ResourceType, configs: Mapping[str, Mapping[str, str]]
) -> list[ConfigResource]:
    """Resources of ``kind`` for ``incremental_alter_configs``: set each name's values."""
    return [
        ConfigResource(
            kind,
            name,
            incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in values.items()
            ],
        )
        for name, values in configs.items()
    ]
