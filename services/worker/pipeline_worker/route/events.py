"""Lifecycle events of level ``all`` on ``<ns>.events``: started, succeeded, progress.

Failures (retried, dead) travel in the move's transaction (:mod:`.policy`), whatever the
level short of ``off``. The events here are one or two per job, so they cost throughput and are
off unless ``events = "all"``; they are produced without a transaction, best effort: when the
producer's queue is full, an event is dropped rather than slowing jobs down. Dropped events,
and events Kafka did not take, are counted (``pipeline_events_dropped_total``) and logged.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, Message, Producer

from pipeline._brokerhealth import BrokerHealth
from pipeline._codec import EventCodec, JobCodec
from pipeline._job import now_ms
from pipeline._newclient import client
from pipeline._producer import producer_config
from pipeline._ratelog import RateLimitedLog
from pipeline._records import Event, EventKind
from pipeline._topics import TopicNames

from .outcome import Outcome, OutcomeKind

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from pipeline import Job, Settings
    from pipeline._context import JobContext

    from .._metrics import WorkerMetrics

_log = logging.getLogger("pipeline.worker.events")


class EventStream:
    """Writes started, succeeded and progress events; see the module docstring."""

    def __init__(self, settings: Settings, codec: JobCodec, metrics: WorkerMetrics) -> None:
        conf: dict[str, Any] = producer_config(settings)
        conf["linger.ms"] = 20
        conf.update(BrokerHealth.of(settings.bootstrap_servers).callbacks("events producer"))
        conf.update(settings.kafka)
        self._producer = client(Producer, conf)
        self._topic = TopicNames(settings.namespace).events
        self._codec = EventCodec(codec.store)
        self._worker = f"{socket.gethostname()}:{os.getpid()}"
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._metrics = metrics

    def started(self, job: Job) -> None:
        self._emit(job, EventKind.STARTED)

    def deduplicated(self, job: Job) -> None:
        """``job`` was acknowledged without running: its idempotency key is taken."""
        self._emit(job, EventKind.DEDUPLICATED)

    def on_outcome(self, outcome: Outcome) -> Awaitable[None] | None:
        if outcome.kind is OutcomeKind.SUCCEEDED and outcome.job is not None:
            self._emit(outcome.job, EventKind.SUCCEEDED, duration_ms=outcome.duration * 1000)
        return None

    def on_progress(self, context: JobContext, fraction: float, detail: str | None) -> None:
        self._emit(context.job, EventKind.PROGRESS, progress=fraction, detail=detail)

    def _emit(self, job: Job, kind: str, **fields: Any) -> None:
        event = Event(
            job_id=job.id,
            job_type=job.type,
            kind=kind,
            attempt=job.attempt,
            priority=job.priority,
            at=now_ms(),
            worker=self._worker,
            **fields,
        )
        try:
            self._producer.produce(
                self._topic, self._codec.encode(event), job.id.encode(), on_delivery=self._sent
            )
        except BufferError:
            self._metrics.events_dropped += 1
        except Exception as exc:  # best effort: an event is never worth a job (nor a batch)
            self._metrics.events_dropped += 1
            self._errors.warning("event", "a lifecycle event was not sent: %s", exc)
        self._producer.poll(0)

    def _sent(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:  # not delivered in time (Kafka unreachable), or refused
            self._metrics.events_dropped += 1
            self._errors.warning("delivery", "a lifecycle event was not delivered: %s", error)

    def close(self, timeout: float = 5.0) -> None:
        left = self._producer.flush(timeout)
        if left:
            _log.warning("%d lifecycle event(s) not delivered at exit", left)
