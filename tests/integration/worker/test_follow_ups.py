"""A job whose handler enqueues jobs ends once Kafka answered for them, on a real broker.

The recording app's ``forward`` handler enqueues a ``noop`` job and returns. Enqueued to the
namespace's own topics, the ``noop`` runs and ``forward`` succeeds. Enqueued to a namespace
whose topics do not exist, Kafka refuses the ``noop``: ``forward`` must fail with that
refusal, be retried, and be dead-lettered once its two attempts are used up, rather than
succeed with its follow-up lost.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline._deadletters import read_dead_letters
from pipeline._records import DeadLetterReason

from .fixtures import with_retry_tiers
from .harness import wait_until

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

RETRY_DELAYS = [0.5, 2.0]


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return with_retry_tiers(bootstrap_servers, namespace, RETRY_DELAYS)


def test_a_job_ends_once_kafka_took_its_follow_up_and_fails_when_kafka_refused_it(
    kit: WorkerKit,
) -> None:
    sent = [kit.producer.enqueue("forward", {"n": n}) for n in range(5)]
    missing = f"{kit.settings.namespace}-missing"
    refused = kit.producer.enqueue("forward", {"n": 100, "namespace": missing})
    kit.producer.flush(60)

    env = {"PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS)}
    worker = kit.workers.start(env=env)

    def noops() -> set[int]:
        return {event.n for event in kit.recording.ends("noop")}

    def letters() -> list[tuple[str | None, str]]:
        return [
            (s.letter.job.id if s.letter.job else None, s.letter.reason)
            for s in read_dead_letters(kit.settings).letters
        ]

    wait_until(lambda: noops() == set(range(5)), timeout=60, what="the follow-ups ran")
    wait_until(lambda: bool(letters()), timeout=90, what="the refused job was dead-lettered")
    worker.terminate()
    assert worker.wait(timeout=60) == 0, worker.log_tail()

    started = Counter(event.job_id for event in kit.recording.starts("forward"))
    returned = Counter(event.job_id for event in kit.recording.ends("forward"))
    assert started == {**dict.fromkeys(sent, 1), refused: 2}
    assert {job: n for job, n in returned.items() if job != refused} == dict.fromkeys(sent, 1)
    # The refused one's first attempt returned and failed with Kafka's refusal. Its second
    # either raised at the enqueue (the producer knew by then that the topic is missing) or
    # returned and was refused the same way: librdkafka's metadata refresh decides which.
    # Either way each attempt failed on the refusal and the second was its last.
    assert returned[refused] >= 1
    assert letters() == [(refused, DeadLetterReason.MAX_ATTEMPTS)]
    [stored] = read_dead_letters(kit.settings).letters
    assert stored.letter.job is not None
    history = stored.letter.job.errors
    assert len(history) == 2, history
    for error in history:
        assert f"topic {missing}.jobs.default does not exist" in error.message, history
