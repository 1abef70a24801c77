"""A worker whose consumer Kafka fences for good stops instead of idling.

Two relays configured with one static member id (``group.instance.id`` passed through
``Settings.kafka``): Kafka lets one of them keep the id and answers the other with a fatal
error. Jobs would wait in their topics behind a consumer that no longer reads; the worker
stops instead (and is restarted by its supervisor), whether the job consumer or the retry
relay's was fenced.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline._admin import apply_topics
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.recovery.relay import RetryRelay
from tests.waiting import wait_for

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_a_fatal_consumer_error_stops_the_relay_and_reaches_the_worker(
    bootstrap_servers: str, namespace: str
) -> None:
    settings = Settings(
        bootstrap_servers=bootstrap_servers,
        namespace=namespace,
        topics={"partitions": 1, "retry_delays_s": [1]},
        kafka={"group.instance.id": f"{namespace}-relay"},
    )
    apply_topics(settings)
    failed = threading.Event()
    errors: list[BaseException] = []

    def on_failed(exc: BaseException) -> None:
        errors.append(exc)
        failed.set()

    relays = [
        RetryRelay(settings, f"{namespace}.workers", WorkerMetrics(), on_failed) for _ in range(2)
    ]
    for relay in relays:
        relay.start()
    try:
        assert failed.wait(60), "no relay reported its fatal consumer error"
        assert "instance" in str(errors[0]).lower(), errors
    finally:
        for relay in relays:
            relay.stop(10)
    assert any(not relay._thread.is_alive() for relay in relays)


def test_a_worker_whose_consumer_kafka_fences_for_good_exits(kit: WorkerKit) -> None:
    """Its job consumer's static member id (``worker.kafka_consumer``, as docs/worker.md shows)
    given to two workers: one exits non-zero, saying why, instead of consuming nothing."""
    static = {"group.instance.id": f"{kit.settings.namespace}-static"}
    env = {"PIPELINE_WORKER__KAFKA_CONSUMER": json.dumps(static)}
    workers = [kit.workers.start(env=env) for _ in range(2)]
    assert wait_for(lambda: any(not w.alive() for w in workers), 60), "\n".join(
        w.log_tail() for w in workers
    )
    [fenced] = [w for w in workers if not w.alive()]
    assert fenced.returncode != 0
    assert "fatal consumer error" in fenced.log(), fenced.log_tail()
