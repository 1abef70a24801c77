"""The stages of one worker process, built from its settings: the composition root's wiring.

What each stage is given says how they meet: the mover (:mod:`.commit.moves`) is shared by the
failure router and the deduplicator, which hand it records, and by the consumer thread, which
writes and commits them; the idempotency-key store is the application's or the Kafka-backed
one (:mod:`.route.changelog`).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline import Pipeline, Priority, Settings
from pipeline._brokerhealth import BrokerHealth
from pipeline._dedupstores import DedupStore
from pipeline._envelopes import service_codec
from pipeline._producer import message_max_bytes
from pipeline._topics import TopicNames

from ._metrics import WorkerMetrics
from .commit.moves import Mover
from .execute.processor import Processor
from .route.changelog import KafkaDedupStore
from .route.dedup import Deduplicator
from .route.events import EventStream
from .route.outcome import JobHooks
from .route.policy import FailurePolicy
from .route.router import FailureRouter


@dataclass(frozen=True, slots=True)
class Stages:
    """What the worker runs, wired together."""

    mover: Mover
    events: EventStream | None
    """Lifecycle events, when ``events`` is ``all``."""
    store: DedupStore
    dedup: Deduplicator
    processor: Processor


def assemble(
    app: Pipeline,
    settings: Settings,
    *,
    priorities: Sequence[Priority],
    topics: Mapping[Priority, str],
    loop: asyncio.AbstractEventLoop,
    metrics: WorkerMetrics,
    middleware: Sequence[JobHooks],
    health: BrokerHealth,
) -> Stages:
    """The stages of a worker of ``app`` on ``topics`` (priority -> topic name)."""
    worker = settings.worker
    mover = Mover(settings, loop)
    events = EventStream(settings, app.codec, metrics) if settings.events == "all" else None
    policy = FailurePolicy(
        settings.namespace,
        settings.topics.retry_delays_s,
        codec=service_codec(app.codec),  # retries and dead letters never wait for a registry
        worker=f"{socket.gethostname()}:{os.getpid()}",
        events=settings.events != "off",
        max_bytes=message_max_bytes(settings),
    )
    store = dedup_store(app, settings, health)
    dedup = Deduplicator(
        store,
        changelog=TopicNames(settings.namespace).dedup,
        topics=topics,
        mover=mover,
        metrics=metrics,
        default_ttl_s=worker.dedup_ttl_s,
        scope=worker.dedup_scope,
    )
    processor = Processor(
        app=app,
        worker=worker,
        priorities=list(priorities),
        topics=topics,
        loop=loop,
        metrics=metrics,
        middleware=middleware,
        context=contextvars.copy_context(),
        router=FailureRouter(policy, mover, metrics),
        events=events,
        dedup=dedup,
    )
    return Stages(mover, events, store, dedup, processor)


def dedup_store(app: Pipeline, settings: Settings, health: BrokerHealth) -> DedupStore:
    """The application's own store (``Pipeline(dedup_store=...)``), else the Kafka one."""
    store = app.dedup_store
    if store is not None:
        return store
    return KafkaDedupStore(
        TopicNames(settings.namespace).dedup,
        {**settings.client_config(), **health.callbacks("dedup restore")},
        scope=settings.worker.dedup_scope,
        restore_timeout_s=settings.worker.dedup_restore_timeout_s,
    )
