"""This process's heartbeats on ``<ns>.workers`` (the record is :mod:`pipeline._workerbeats`).

A task on the event loop samples the counters the processor keeps anyway (jobs in flight, jobs
finished) ten times per interval and, once per ``worker.heartbeat_interval_s``, produces one
record with its own small producer: the worker's other producers are transactional, and a
heartbeat must neither wait for nor join their transactions. Nothing on a job's path changes.
A clean stop writes a tombstone, so the worker disappears from the table at once; a worker that
dies leaves its last heartbeat, which readers see go stale. When the topic does not exist (the
deployment's topics were not applied since heartbeats came) the worker warns once, naming
``pipeline topics apply``, and publishes nothing more.

:func:`process_client_id` gives each worker process a client id of its own, which its consumer
uses and the group coordinator reports, and which keys the process's heartbeats.
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
from pipeline._producer import producer_config
from pipeline._topics import TopicNames
from pipeline._workerbeats import WorkerBeat, encode_beat

if TYPE_CHECKING:
    from ._work import PartitionState
    from .execute.processor import Processor

_log = logging.getLogger("pipeline.worker.beats")

SAMPLES = 10
"""In-flight samples per interval, averaged into the utilization."""
CLOSE_TIMEOUT_S = 2.0
"""How long a stop waits for the tombstone (it does not wait while Kafka is unreachable)."""
TOPIC_CHECK_S = 10.0
"""How long the first look for the heartbeat topic may take before heartbeats start anyway."""
_DEFAULT_CLIENT_ID = Settings.model_fields["client_id"].default
_workers_in_process = itertools.count(1)
_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


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


@dataclass(frozen=True)
class Counters:
    """What a heartbeat reads: the processor's own counters and the owned partitions."""

    in_flight: Callable[[], int]
    jobs_done: Callable[[], int]
    partitions: Callable[[], list[tuple[str, int]]]


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
        self._started_at_ms = now_ms()
        self._samples: list[int] = []
        self._partitions: tuple[tuple[str, int], ...] = ()
        self.published = 0
        self.off = False
        """Set once the topic turned out missing: nothing more is published."""
        conf = producer_config(settings)
        conf["linger.ms"] = 0
        self._health = BrokerHealth.of(settings.bootstrap_servers)
        conf.update(self._health.callbacks("heartbeat producer"))
        conf.update(settings.kafka)
        self._producer = producer_factory(conf)

    async def run(self) -> None:
        """Publish at once, then every interval, until cancelled or the topic is missing."""
        try:
            await self._run()
        except Exception:  # a bug here must not stop the worker: only its heartbeats
            self.off = True
            _log.warning("heartbeats stopped", exc_info=True)

    async def _run(self) -> None:
        if not await asyncio.to_thread(self._topic_exists):
            self._turn_off()
            return
        step = self.interval_s / SAMPLES
        while not self.off:
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
        )

    def _owned(self) -> tuple[tuple[str, int], ...]:
        # RuntimeError: the consumer thread changed the assignment meanwhile; keep the last one.
        with contextlib.suppress(RuntimeError):
            self._partitions = tuple(sorted(self._counters.partitions()))
        return self._partitions

    def publish(self) -> None:
        self._produce(encode_beat(self.beat()))
        self.published += 1

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
            self._producer.produce(
                self.topic, value, self.client_id.encode(), on_delivery=self._delivered
            )
        except (BufferError, KafkaException) as exc:  # Kafka unreachable for long: skip one
            _log.debug("heartbeat not queued: %s", exc)

    def _delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None and error.code() in _MISSING:
            self._turn_off()

    def _topic_exists(self) -> bool:
        deadline = time.monotonic() + TOPIC_CHECK_S
        while True:  # in steps: a worker Kafka refused stops at once, without waiting for this
            try:
                # No topic argument: asking for a named topic may auto-create it on some brokers.
                topics = self._producer.list_topics(timeout=1.0).topics
                break
            except KafkaException:
                self._producer.poll(0)  # its error callbacks tell the tracker of a refusal
                if self._health.refusal is not None or time.monotonic() >= deadline:
                    return True  # unknown yet: the delivery reports will tell
        meta = topics.get(self.topic)
        return meta is not None and meta.error is None

    def _turn_off(self) -> None:
        if self.off:
            return
        self.off = True
        _log.warning(
            "topic %s does not exist: no heartbeats, so `pipeline status` shows no in-flight "
            "jobs for this worker; create it with `pipeline topics apply` (then restart)",
            self.topic,
        )


def heartbeats_of(
    settings: Settings,
    client_id: str,
    group: str,
    processor: Processor,
    states: Callable[[], list[PartitionState]],
) -> Heartbeats | None:
    """The publisher of a worker's heartbeats (None: ``heartbeat_interval_s`` is 0)."""
    if not settings.worker.heartbeat_interval_s:
        return None

    def owned() -> list[tuple[str, int]]:
        return [(s.topic, s.partition) for s in states()]

    counters = Counters(lambda: processor.in_flight, lambda: processor.finished, owned)
    return Heartbeats(settings, client_id=client_id, group=group, counters=counters)
