"""The worker group seen from Kafka: committed offsets, end offsets, members; and producing."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.waiting import wait_for

from .processes import WorkerProcess, wait_until
from .runs import Recording, TopicPartitionKey

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence

    from pipeline import Pipeline, Settings


class GroupOffsets:
    """The worker group's committed offsets and the topics' end offsets.

    Reading committed offsets (OffsetFetch) does not join the group, so this never disturbs the
    workers' assignment.
    """

    def __init__(self, settings: Settings, group: str | None = None) -> None:
        self.settings = settings
        self.group = group or settings.worker.group_id or f"{settings.namespace}.workers"
        conf: dict[str, Any] = {
            **settings.client_config(),
            "group.id": self.group,
            "enable.auto.commit": False,
        }
        self._consumer = Consumer(conf)
        self._partitions: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        tps: list[TopicPartition] = []
        for topic in topics:
            if topic not in self._partitions:
                metadata = self._consumer.list_topics(topic, timeout=10)
                self._partitions[topic] = sorted(metadata.topics[topic].partitions)
            tps.extend(TopicPartition(topic, p) for p in self._partitions[topic])
        return tps

    def committed(self, topics: Iterable[str]) -> dict[TopicPartitionKey, int]:
        """Committed offset per partition; 0 where the group committed nothing yet."""
        tps = self.partitions(topics)
        found: list[TopicPartition] = []

        def answered() -> bool:
            try:
                with self._lock:
                    found[:] = self._consumer.committed(tps, timeout=10)
            except KafkaException as exc:
                # A broker that just started may not host the group's coordinator yet; offsets
                # a killed worker left in an open transaction are not stable until the broker
                # aborts it (transaction.timeout.ms after its last write): the fetch times out.
                error = exc.args[0]
                if not error.retriable() and error.code() != KafkaError._TIMED_OUT:
                    raise
                return False
            return True

        if not wait_for(answered, 60, interval=0.2):
            raise AssertionError(f"no committed offsets of group {self.group} within 60 s")
        return {
            (tp.topic, tp.partition): (0 if tp.offset == OFFSET_INVALID else tp.offset)
            for tp in found
        }

    def metadata(self, topic: str, partition: int) -> tuple[int, str | None]:
        """The committed offset of one partition (-1: none) and the metadata committed with it."""
        with self._lock:
            [tp] = self._consumer.committed([TopicPartition(topic, partition)], timeout=10)
        return (tp.offset if tp.offset >= 0 else -1), tp.metadata

    def ends(self, topics: Iterable[str]) -> dict[TopicPartitionKey, int]:
        """The high watermark (next offset to be written) of every partition."""
        with self._lock:
            return {
                (tp.topic, tp.partition): self._consumer.get_watermark_offsets(
                    tp, timeout=10, cached=False
                )[1]
                for tp in self.partitions(topics)
            }

    def lag(self, topics: Sequence[str]) -> dict[TopicPartitionKey, int]:
        """End minus committed offset, for partitions where it is not zero."""
        committed = self.committed(topics)
        return {
            tp: end - committed[tp] for tp, end in self.ends(topics).items() if end != committed[tp]
        }

    def wait_drained(
        self, topics: Sequence[str], *, timeout: float, watch: Sequence[WorkerProcess] = ()
    ) -> None:
        """Wait until the committed offset of every partition equals its end offset."""
        wait_until(
            lambda: not self.lag(topics),
            timeout=timeout,
            what=lambda: f"committed offsets to reach the end offsets; lag: {self.lag(topics)}",
            watch=watch,
            interval=0.2,
        )

    def close(self) -> None:
        self._consumer.close()


class CommitAuditor:
    """Checks that no committed offset passes a job that has not finished.

    Each check reads the committed offsets first and the recording second. A job is finished
    once its handler wrote its end line, which happens before the worker can count it done and
    commit past it; so when the commit was read, every offset below it must already have an end
    line in the file. ``skip`` lists offsets that are not jobs of the recording app (garbage).
    """

    def __init__(
        self,
        offsets: GroupOffsets,
        recording: Recording,
        topics: Sequence[str],
        skip: Mapping[TopicPartitionKey, set[int]] | None = None,
    ) -> None:
        self.offsets = offsets
        self.recording = Recording(recording.path)  # its own reader: safe in the audit thread
        self.topics = list(topics)
        self.skip = skip or {}
        self.violations: list[str] = []
        self.checks = 0
        self.highest_commit = 0
        self._finished: dict[TopicPartitionKey, set[int]] = defaultdict(set)
        self._prefix: dict[TopicPartitionKey, int] = defaultdict(int)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        committed = self.offsets.committed(self.topics)
        for event in self.recording.refresh():
            if event.kind == "E":
                self._finished[event.tp].add(event.offset)
        for tp, offset in committed.items():
            finished, skip = self._finished[tp], self.skip.get(tp, set())
            prefix = self._prefix[tp]
            while prefix in finished or prefix in skip:
                prefix += 1
            self._prefix[tp] = prefix
            if offset > prefix:
                self.violations.append(
                    f"{tp[0]}[{tp[1]}] committed offset {offset}, but the job at offset {prefix} "
                    "had not finished when that commit was read"
                )
            self.highest_commit = max(self.highest_commit, offset)
        self.checks += 1

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.check()

    def start(self, interval: float = 0.1) -> CommitAuditor:
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the audit thread and make one last check."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.check()

    def assert_clean(self) -> None:
        assert self.checks > 1, "the commit auditor never ran"
        assert self.highest_commit > 0, "the auditor never saw a commit: it proved nothing"
        assert not self.violations, "\n".join(self.violations[:20])


@contextlib.contextmanager
def auditing(auditor: CommitAuditor, interval: float = 0.1) -> Iterator[CommitAuditor]:
    """Run ``auditor`` in the background for the ``with`` block."""
    auditor.start(interval)
    try:
        yield auditor
    finally:
        auditor.stop()


@dataclass(frozen=True)
class GroupSnapshot:
    """The group as its coordinator describes it: state, and member id -> client id."""

    state: str
    members: dict[str, str]

    @property
    def stable(self) -> bool:
        return "STABLE" in self.state

    @property
    def clients(self) -> set[str]:
        return set(self.members.values())


@functools.cache
def _admin(config: frozenset[tuple[str, str]]) -> AdminClient:
    conf: dict[str, str | int | float | bool] = dict(config)
    return AdminClient(conf)


def drop_admins() -> None:
    """Drops the admin clients :func:`describe_group` keeps, so none outlives its cluster (a
    client of a cluster that is gone keeps reconnecting to its addresses)."""
    _admin.cache_clear()


def describe_group(settings: Settings, group: str) -> GroupSnapshot:
    admin = _admin(frozenset(settings.client_config().items()))
    futures = admin.describe_consumer_groups([group], request_timeout=10)
    description = futures[group].result(timeout=15)
    return GroupSnapshot(
        str(description.state), {m.member_id: m.client_id for m in description.members}
    )


def wait_joined(
    settings: Settings,
    group: str,
    workers: Sequence[WorkerProcess],
    *,
    stable: bool = True,
    timeout: float = 90,
) -> None:
    """Wait until every worker in ``workers`` is a member of the group (and it is stable)."""
    wanted = {worker.client_id for worker in workers}

    def joined() -> bool:
        snapshot = describe_group(settings, group)
        return (snapshot.stable or not stable) and wanted <= snapshot.clients

    wait_until(
        joined,
        timeout=timeout,
        what=lambda: f"{sorted(wanted)} to join {group}: {describe_group(settings, group)}",
        watch=workers,
        interval=0.2,
    )


# --- Producing jobs ----------------------------------------------------------------------------


def enqueue(
    app: Pipeline,
    job_type: str,
    count: int,
    *,
    first: int = 0,
    fields: Mapping[str, Any] | None = None,
    **options: Any,
) -> list[str]:
    """Enqueue ``count`` jobs ``{"n": first + i, **fields}`` and wait for Kafka to ack them
    (one by one with an ``idempotency_key``, which ``enqueue_many`` refuses)."""
    extra = dict(fields or {})
    payloads = ({"n": first + i, **extra} for i in range(count))
    if "idempotency_key" in options:
        ids = [app.enqueue(job_type, payload, **options) for payload in payloads]
    else:
        ids = app.enqueue_many(job_type, payloads, **options)
    app.flush(60)
    return ids
