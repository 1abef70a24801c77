"""The retry relay's producer failing for good, against a real broker: a new producer takes
its place, the relay reads its tier again from what was committed, and every retried job is
returned to its priority topic once; the relay goes on and the worker is not stopped.

The producer is fenced by another producer registering its transactional id (the same fatal
error Kafka gives a producer whose transaction it aborted on timeout).
"""

from __future__ import annotations

import json
import uuid
from collections import Counter

import pytest
from confluent_kafka import Producer

from pipeline import Job, JobCodec, Priority
from pipeline._admin import apply_topics
from pipeline._topics import TopicNames
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker.recovery import relay as relay_module
from pipeline_worker.recovery.relay import RetryRelay
from tests.waiting import wait_for

from .fixtures import with_retry_tiers
from .test_moves_outage import committed_values
from .test_moves_renewal import Factory

pytestmark = pytest.mark.kafka


def _retried(n: int) -> Job:
    payload = json.dumps({"n": n}).encode()
    return Job(id=str(uuid.uuid4()), type="noop", payload=payload, attempt=2)


def test_a_fenced_relay_producer_is_replaced_and_each_job_returned_once(
    bootstrap_servers: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = with_retry_tiers(bootstrap_servers, namespace, [0.5])
    apply_topics(settings)
    names = TopicNames(namespace)
    target = names.jobs(Priority.DEFAULT)
    factory = Factory()
    monkeypatch.setattr(relay_module, "Producer", factory)
    failures: list[BaseException] = []
    relay = RetryRelay(settings, f"{namespace}.workers", WorkerMetrics(), failures.append)
    codec = JobCodec()
    tier = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})

    def on_tier(job: Job) -> bytes:
        value = codec.encode(job)
        tier.produce(names.retry(0), value, b"key", partition=0)
        assert tier.flush(30) == 0
        return value

    def returned() -> list[bytes | None]:
        return committed_values(bootstrap_servers, target)

    relay.start()
    try:
        first = on_tier(_retried(1))
        assert wait_for(lambda: returned() == [first], 60), returned()
        intruder = Producer(factory.made[0])
        intruder.init_transactions(30)  # fences the relay's producer: a fatal error at its next use
        second = on_tier(_retried(2))
        assert wait_for(lambda: second in returned(), 60), (returned(), failures)
        assert Counter(returned()) == Counter([first, second])  # each once
        assert len(factory.made) == 2, "the producer was not replaced"
        assert relay._txn.renewals == 1
        third = on_tier(_retried(3))  # the new producer goes on
        assert wait_for(lambda: third in returned(), 60), (returned(), failures)
        assert Counter(returned()) == Counter([first, second, third])
        assert failures == []
        assert relay._thread.is_alive()
    finally:
        relay.stop(30)
    assert not relay._thread.is_alive()
