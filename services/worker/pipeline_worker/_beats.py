"""This process's heartbeats on ``<ns>.workers`` (the record is :mod:`pipeline._workerbeats`).

A task on the event loop samples the counters the processor keeps anyway (jobs in flight, jobs
finished) ten times per interval and, once per ``worker.heartbeat_interval_s``, produces one
record with its own small producer: the worker's other producers are transactional, and a
heartbeat must neither wait for nor join their transactions. Nothing on a job's path changes.
A clean stop writes a tombstone, so the worker disappears from the table at once; a worker that
dies leaves its last heartbeat, which readers see go stale. The records are keyed by
:func:`~pipeline._workerbeats.beat_key` (client id, host and pid), so replicas that share a
client id neither overwrite nor tombstone each other's.

When the topic does not exist (the deployment's topics were not applied since heartbeats came)
the worker warns once, naming ``pipeline topics apply``, publishes nothing, and looks again
every :data:`RECHECK_S`: heartbeats resume once the topic exists. A delivery error that says
the topic is unknown (metadata still settling after ``topics apply``, a broker restarting) is
only a doubt: the cluster is asked (:func:`~pipeline._topiccheck.missing_topics`), at most once
per :data:`RECHECK_S`, and heartbeats stop only if it confirms the topic is missing.

:func:`process_client_id` gives each worker process a client id of its own, which its consumer
uses and the group coordinator reports. Where replicas share one anyway (``PIPELINE_CLIENT_ID``
set for every pod), each heartbeat also carries its consumer's group member id (the consumer
thread's :attr:`~.intake.consumer.ConsumerThread.member_id`), by which ``pipeline status`` tells
the replicas apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pipeline import Settings
from pipeline._brokerhealth import BrokerHealth
from pipeline._job import now_ms
from pipeline._newclient import client
from pipeline._producer import producer_config
from pipeline._topiccheck import is_missing_topic, missing_topics
from pipeline._topics import TopicNames
from pipeline._workerbeats import WorkerBeat, beat_key, encode_beat

if TYPE_CHECKING:
    from confluent_kafka.admin import ClusterMetadata

    from ._work import PartitionState
    from .execute.processor import Processor

_log = logging.getLogger("pipeline.worker.beats")

SAMPLES = 10
"""In-flight samples per interval, averaged into the utilization."""
CLOSE_TIMEOUT_S = 2.0
"""How long a stop waits for the tombstone (it does not wait while Kafka is unreachable)."""
TOPIC_CHECK_S = 10.0
"""How long the first look for the heartbeat topic may take before heartbeats start anyway."""
RECHECK_S = 30.0
"""At most one later look for the topic this often: while it is missing, or after a delivery
error said it was."""
_DEFAULT_CLIENT_ID = Settings.model_fields["client_id"].default
_workers_in_process = itertools.count(1)


def process_client_id(settings: Settings, child_index: int | None = None) -> str:
    """The client id of this worker process's Kafka clients.

    The default ``client_id`` (``pipeline``) is shared by every process, so it becomes
    ``pipeline-<host>-<pid>``. A ``client_id`` that was set is used as it is (give each process
    its own), with ``-<index>`` added in each child of ``--processes N``. A second worker in the
    same process adds ``-<n>``.
    """
    if settings.client_id == _DEFAULT_CLIENT_ID:
        client_id = f"{settings.client_id}-{socket.gethostname()}-{os.getpid()}"
    elif child_index is not None:
        client_id = f"{settings.client_id}-{child_index}"
    else:
        client_id = settings.client_id
    number = next(_workers_in_process)
    return client_id if number == 1 else f"{client_id}-{number}"


def _not_joined() -> str | None:
    return None


@dataclass(frozen=True)
class Counters:
    """What a heartbeat reads: the processor's own counters, the owned partitions and the
    consumer's group member id (None: not joined yet)."""

    in_flight: Callable[[], int]
    jobs_done: Callable[[], int]
    partitions: Callable[[], list[tuple[str, int]]]
    member_id: Callable[[], str | None] = _not_joined


class Heartbeats:
    """Publishes this process's heartbeats until :meth:`close`; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        *,
        client_id: str,
        group: str,
        counters: Counters,
        producer_factory: Callable[[dict[str, Any]], Any] = Producer,
    ) -> None:
        worker = settings.worker
        self.interval_s = worker.heartbeat_interval_s
        self.topic = TopicNames(settings.namespace).workers
        self.client_id = client_id
        self._counters = counters
        self._concurrency = worker.concurrency
        self._group = group
        self._host = socket.gethostname()
        self._pid = os.getpid()
        self.key = beat_key(client_id, self._host, self._pid).encode()
        """The key of this process's records: its own, even where replicas share a client id."""
        self._started_at_ms = now_ms()
        self._samples: list[int] = []
        self._partitions: tuple[tuple[str, int], ...] = ()
        self.published = 0
        self.off = False
        """Set while the cluster says the topic is missing: nothing is published meanwhile."""
        self._doubt = False
        """Set by a delivery error saying the topic is unknown: the next tick asks the cluster."""
        self._next_check = 0.0
        conf = producer_config(settings)
        conf["linger.ms"] = 0
        self._health = BrokerHealth.of(settings.bootstrap_servers)
        conf.update(self._health.callbacks("heartbeat producer"))
        conf.update(settings.kafka)
        self._producer = client(producer_factory, conf)

    async def run(self) -> None:
        """Publish at once, then every interval (while the topic exists), until cancelled."""
        try:
            await self._run()
        except Exception:  # a bug here must not stop the worker: only its heartbeats
            self.off = True
            _log.warning("heartbeats stopped", exc_info=True)

    async def _run(self) -> None:
        if await asyncio.to_thread(self._topic_missing, TOPIC_CHECK_S):
            self._turn_off()
            self._next_check = time.monotonic() + RECHECK_S
        step = self.interval_s / SAMPLES
        while True:
            if self.off or self._doubt:
                await self._check()
            if not self.off:
                self._samples.append(self._counters.in_flight())
                self.publish()
            self._samples.clear()
            for _ in range(SAMPLES):
                await asyncio.sleep(step)
                self._samples.append(self._counters.in_flight())
            self._producer.poll(0)

    def beat(self) -> WorkerBeat:
        """The heartbeat now, from the samples taken since the last one."""
        in_flight = self._counters.in_flight()
        samples = self._samples or [in_flight]
        busy = sum(samples) / len(samples) / self._concurrency
        return WorkerBeat(
            client_id=self.client_id,
            group=self._group,
            host=self._host,
            pid=self._pid,
            started_at_ms=self._started_at_ms,
            at_ms=now_ms(),
            interval_s=self.interval_s,
            concurrency=self._concurrency,
            in_flight=in_flight,
            utilization=min(1.0, max(0.0, busy)),
            jobs_done=self._counters.jobs_done(),
            partitions=self._owned(),
            member_id=self._counters.member_id() or "",
        )

    def _owned(self) -> tuple[tuple[str, int], ...]:
        # RuntimeError: the consumer thread changed the assignment meanwhile; keep the last one.
        with contextlib.suppress(RuntimeError):
            self._partitions = tuple(sorted(self._counters.partitions()))
        return self._partitions

    def publish(self) -> None:
        self._produce(encode_beat(self.beat()))
        self.published += 1

    async def _check(self) -> None:
        """Ask the cluster whether the topic exists, at most once per :data:`RECHECK_S`."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + RECHECK_S
        doubt, self._doubt = self._doubt, False
        missing = await asyncio.to_thread(self._topic_missing, 1.0)
        if missing is None:  # no answer: carry on as before, the delivery reports will tell
            return
        if missing:
            self._turn_off()
        elif self.off:
            self.off = False
            _log.warning("topic %s exists now: heartbeats resume", self.topic)
        elif doubt:
            _log.info("a heartbeat found no topic %s, but it exists: heartbeats go on", self.topic)

    def close(self) -> None:
        """The tombstone (a clean stop), then wait a little for what is queued."""
        if not self.off and self.published:
            self._produce(None)
        down = self._health.unreachable_for() is not None or self._health.refusal is not None
        left = self._producer.flush(0 if down else CLOSE_TIMEOUT_S)
        if left:
            _log.warning("%d heartbeat record(s) not delivered at exit", left)

    def _produce(self, value: bytes | None) -> None:
        try:
            self._producer.produce(self.topic, value, self.key, on_delivery=self._delivered)
        except (BufferError, KafkaException) as exc:  # Kafka unreachable for long: skip one
            _log.debug("heartbeat not queued: %s", exc)

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if is_missing_topic(error):  # maybe metadata settling: the next tick asks the cluster
            _log.debug("heartbeat not delivered: %s", error)
            self._doubt = True

    def _topic_missing(self, within_s: float) -> bool | None:
        """Whether the cluster says the topic is missing (None: it did not answer in time)."""
        deadline = time.monotonic() + within_s
        while True:  # in steps: a worker Kafka refused stops at once, without waiting for this
            try:
                return bool(missing_topics(_EveryTopic(self._producer), [self.topic], 1.0))
            except KafkaException:
                self._producer.poll(0)  # its error callbacks tell the tracker of a refusal
                if self._health.refusal is not None or time.monotonic() >= deadline:
                    return None  # unknown yet: the delivery reports will tell

    def _turn_off(self) -> None:
        if self.off:
            return
        self.off = True
        _log.warning(
            "topic %s does not exist, or Kafka's ACLs hide it from this worker (no WRITE on it, "
            "which would allow describing it, as the check at start says): no heartbeats, so "
            "`pipeline status` shows no in-flight jobs for this worker; create it with "
            "`pipeline topics apply`, or allow the worker to write it (they resume then)",
            self.topic,
        )


class _EveryTopic:
    """The producer's metadata of every topic, whatever topic is asked for: asking a broker for
    a named topic may auto-create it, with none of the configs ``pipeline topics apply`` sets."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        metadata: ClusterMetadata = self._producer.list_topics(timeout=timeout)
        return metadata


def heartbeats_of(
    settings: Settings,
    client_id: str,
    group: str,
    processor: Processor,
    states: Callable[[], list[PartitionState]],
    member_id: Callable[[], str | None] = _not_joined,
) -> Heartbeats | None:
    """The publisher of a worker's heartbeats (None: ``heartbeat_interval_s`` is 0);
    ``member_id`` reads its consumer's group member id."""
    if not settings.worker.heartbeat_interval_s:
        return None

    def owned() -> list[tuple[str, int]]:
        return [(s.topic, s.partition) for s in states()]

    counters = Counters(lambda: processor.in_flight, lambda: processor.finished, owned, member_id)
    return Heartbeats(settings, client_id=client_id, group=group, counters=counters)
