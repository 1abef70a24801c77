"""The real side: a ``pipeline-worker`` process (and a ``pipeline-scheduler`` for delayed jobs)
running the suite's application against a real Kafka, one of each for all the scenarios.

Outcomes come from what the worker writes to Kafka, never from the handlers: a success is the
``succeeded`` event on ``<ns>.events`` (the worker runs with ``PIPELINE_EVENTS=all``), and so is
a job dropped for its idempotency key (``deduplicated``); a dead job is its dead letter on
``<ns>.dlq`` (its reason and the attempt it died at; a message that is not a job is known by
its bytes). Both topics are read incrementally by one consumer, polled with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from pipeline import Pipeline
from pipeline._admin import apply_topics
from pipeline._codec import DeadLetterCodec, EventCodec
from pipeline._records import EventKind
from pipeline._topics import TopicNames
from tests.integration.scheduler.conftest import SchedulerFactory, SchedulerProcess
from tests.integration.worker.fixtures import with_retry_tiers
from tests.integration.worker.harness import WorkerLauncher, WorkerProcess, wait_joined, wait_until
from tests.integration.worker.harness.gates import Gates
from tests.integration.worker.harness.metrics import free_port

from .app import RECORD_ENV, make_app, wall_ms
from .backlog import held_worker
from .harness import PARTITIONS, Call, Harness, Outcome, Settled, raw_name, read_calls

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from pipeline import Settings

APP = "tests.behaviour.app:app"
RETRY_DELAYS_S = [0.5, 2.0]
CONCURRENCY = 8
WORKER_ARGS = ("--concurrency", str(CONCURRENCY), "--key-ordering", "--policy", "strict")
"""Key ordering on and the strict priority policy: the stub runs one job at a time, so jobs of a
key never overlap there, and always takes the highest priority's job that is due."""
WORKER_ENV = {
    "PIPELINE_EVENTS": "all",
    "PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS_S),
}


class WorkerOutputs:
    """The worker's account of jobs: ``succeeded`` events and dead letters, read as they come."""

    def __init__(self, settings: Settings) -> None:
        names = TopicNames(settings.namespace)
        self._events, self._dlq = names.events, names.dlq
        self._consumer = Consumer(
            {
                **settings.client_config(),
                "group.id": f"{settings.namespace}.behaviour-reader",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        partitions = [
            TopicPartition(topic, partition, OFFSET_BEGINNING)
            for topic in (self._events, self._dlq)
            for partition in self._consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ]
        self._consumer.assign(partitions)
        self._event_codec, self._letter_codec = EventCodec(), DeadLetterCodec()
        self.outcomes: dict[str, Outcome] = {}

    def refresh(self) -> None:
        for message in self._consumer.consume(1000, 0.1):
            error = message.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error.str()
                continue
            value = message.value() or b""
            if message.topic() == self._dlq:
                letter = self._letter_codec.decode(value)
                if letter.job is None:  # not a job: known by its bytes
                    name = raw_name(letter.raw_value or b"")
                    self.outcomes[name] = Outcome("dead", letter.reason, 0)
                else:
                    outcome = Outcome("dead", letter.reason, letter.job.attempt)
                    self.outcomes[letter.job.id] = outcome
            else:
                event = self._event_codec.decode(value)
                if event.kind == EventKind.SUCCEEDED:
                    self.outcomes[event.job_id] = Outcome("succeeded", None, event.attempt)
                elif event.kind == EventKind.DEDUPLICATED:
                    self.outcomes[event.job_id] = Outcome("deduplicated", None, event.attempt)

    def close(self) -> None:
        self._consumer.close()


@dataclass
class KafkaHarness(Harness):
    """The suite's application on a real worker; see the module docstring."""

    settings: Settings
    record: Path
    worker: WorkerProcess
    scheduler: SchedulerProcess
    outputs: WorkerOutputs
    metrics_port: int
    producer: Pipeline = field(init=False)
    foreign: Pipeline = field(init=False)
    gates: Gates = field(init=False, default_factory=Gates)
    name: str = "kafka"

    def __post_init__(self) -> None:
        self.producer = make_app(self.settings)
        self.foreign = Pipeline(self.settings)  # knows no job type

    def warm_up(self) -> None:
        """Take each path once (a retry tier; ``<ns>.deferred`` and the scheduler): the first
        use of each costs a fresh worker seconds that bounds on lateness should not count."""
        jobs = [
            self.enqueue("later", {"after_s": 0.1}),
            self.enqueue("echo", {"text": "warm-up"}, delay_s=0.1),
        ]
        self.settle(jobs, timeout_s=60)

    def now_ms(self) -> int:
        return wall_ms()

    def send_raw(self, value: bytes) -> str:
        producer = Producer(self.settings.client_config())
        producer.produce(self.producer.topics.jobs("default"), value)
        assert producer.flush(30) == 0, "Kafka did not take a raw message within 30 s"
        return raw_name(value)

    @contextlib.contextmanager
    def backlog(self) -> Iterator[None]:
        def enqueue_gate() -> None:
            self.producer.enqueue("gate", {"port": self.gates.port})
            self.producer.flush(30)

        self.backlog_counts = Counter()
        try:
            with held_worker(
                self.gates,
                CONCURRENCY,
                enqueue_gate,
                self.backlog_counts,
                metrics_port=self.metrics_port,
                worker=self.worker,
            ):
                yield
                self.producer.flush(30)
                self.foreign.flush(30)
        finally:
            self.backlog_counts = None

    def settle(self, job_ids: Sequence[str], timeout_s: float = 30.0) -> Settled:
        self.producer.flush(30)
        self.foreign.flush(30)
        outcomes = self.outputs.outcomes

        def settled() -> bool:
            self.outputs.refresh()
            return all(job_id in outcomes for job_id in job_ids)

        wait_until(
            settled,
            timeout=timeout_s,
            what=lambda: f"jobs to settle; not yet: {[i for i in job_ids if i not in outcomes]}",
            watch=[self.worker],
            interval=0.01,
        )
        calls = read_calls(self.record, job_ids)
        return Settled(
            {job_id: _with_value(outcomes[job_id], job_id, calls) for job_id in job_ids}, calls
        )

    def close(self) -> None:
        self.worker.kill()
        self.scheduler.kill()
        self.outputs.close()
        self.gates.close()
        self.producer.close(30)
        self.foreign.close(30)


def _with_value(outcome: Outcome, job_id: str, calls: Sequence[Call]) -> Outcome:
    """A success with the value its handler returned: the worker writes it nowhere, so it is
    the one the observer recorded for the attempt that succeeded."""
    if outcome.status != "succeeded":
        return outcome
    values = [
        call.value
        for call in calls
        if call.job_id == job_id and call.attempt == outcome.attempts and call.ended == "return"
    ]
    assert len(values) == 1, f"job {job_id} succeeded at attempt {outcome.attempts}: {calls}"
    return Outcome(outcome.status, outcome.reason, outcome.attempts, values[0])


def start_kafka_harness(bootstrap_servers: str, tmp: Path) -> KafkaHarness:
    """A namespace of its own with short retry tiers, its topics, a worker and a scheduler."""
    settings = with_retry_tiers(bootstrap_servers, f"b{uuid.uuid4().hex[:8]}", RETRY_DELAYS_S)
    assert settings.topics.partitions == PARTITIONS
    apply_topics(settings)
    record = tmp / "calls.log"
    launcher = WorkerLauncher(settings, record, tmp, app=APP, env={RECORD_ENV: str(record)})
    schedulers = SchedulerFactory(settings, tmp)
    scheduler = schedulers.start()
    metrics_port = free_port()
    worker = launcher.start(*WORKER_ARGS, "--metrics-port", str(metrics_port), env=WORKER_ENV)
    try:
        schedulers.wait_leading(scheduler)
        wait_joined(settings, f"{settings.namespace}.workers", [worker])
    except BaseException:
        worker.kill()
        scheduler.kill()
        raise
    harness = KafkaHarness(
        settings, record, worker, scheduler, WorkerOutputs(settings), metrics_port
    )
    try:
        harness.warm_up()
    except BaseException:
        harness.close()
        raise
    return harness
