"""Lifecycle events on ``<ns>.events`` and the move counters, for jobs that succeed and fail.

A real ``pipeline-worker`` runs a mix of recording-app jobs: ``noop`` (succeeds), ``flaky``
(fails once, then succeeds), ``doomed`` (always fails: twice with a transient error, or once
with a fatal one). Each job's events must be exactly those of its runs, in order, in one
partition: with ``events = all`` every run's ``started`` and ``succeeded``, and at both levels
one ``retried`` per retry and one ``dead`` per dead letter.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline._codec import EventCodec
from pipeline._deadletters import _Reader, read_dead_letters
from pipeline._records import Event, EventKind
from pipeline._topics import TopicNames
from tests.waiting import wait_for

from .fixtures import with_retry_tiers
from .harness import enqueue
from .harness.metrics import free_port, scrape, total

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

RETRY_DELAYS = [0.5, 2.0]
WORKER_ENV = {"PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS)}
RETRIED = "pipeline_jobs_retried_total"
DEAD_LETTERED = "pipeline_jobs_dead_lettered_total"

Step = tuple[str, int]
"""An event as the test compares it: its kind and the attempt it is about."""

STARTED, SUCCEEDED = EventKind.STARTED.value, EventKind.SUCCEEDED.value
RETRIED_KIND, DEAD = EventKind.RETRIED.value, EventKind.DEAD.value
LIFECYCLES: dict[str, list[Step]] = {
    "succeeds": [(STARTED, 1), (SUCCEEDED, 1)],
    "fails once": [(STARTED, 1), (RETRIED_KIND, 1), (STARTED, 2), (SUCCEEDED, 2)],
    "always fails": [(STARTED, 1), (RETRIED_KIND, 1), (STARTED, 2), (DEAD, 2)],
    "fails fatally": [(STARTED, 1), (DEAD, 1)],
}
"""Every event of each kind of job at level ``all`` (max_attempts=2)."""
JOB_TYPES = {
    "succeeds": "noop",
    "fails once": "flaky",
    "always fails": "doomed",
    "fails fatally": "doomed",
}


@pytest.fixture
def settings(bootstrap_servers: str, namespace: str) -> Settings:
    return with_retry_tiers(bootstrap_servers, namespace, RETRY_DELAYS)


@pytest.mark.parametrize(
    ("level_env", "kinds"),
    [
        pytest.param(
            {"PIPELINE_EVENTS": "all"}, {STARTED, SUCCEEDED, RETRIED_KIND, DEAD}, id="all"
        ),
        pytest.param({}, {RETRIED_KIND, DEAD}, id="errors-by-default"),
    ],
)
def test_each_job_gets_the_events_of_its_runs_and_the_counters_count_its_moves(
    kit: WorkerKit,
    monkeypatch: pytest.MonkeyPatch,
    level_env: dict[str, str],
    kinds: set[str],
) -> None:
    # Workers inherit the environment: the errors case must run at the default level.
    monkeypatch.delenv("PIPELINE_EVENTS", raising=False)
    jobs: dict[str, str] = {}  # job id -> lifecycle
    jobs |= dict.fromkeys(enqueue(kit.producer, "noop", 4), "succeeds")
    jobs |= dict.fromkeys(
        enqueue(kit.producer, "flaky", 4, first=10, fields={"failures": 1}, max_attempts=2),
        "fails once",
    )
    jobs |= dict.fromkeys(
        enqueue(kit.producer, "doomed", 3, first=20, max_attempts=2), "always fails"
    )
    jobs |= dict.fromkeys(
        enqueue(kit.producer, "doomed", 2, first=30, fields={"fatal": True}, max_attempts=2),
        "fails fatally",
    )
    succeeding = {i for i, life in jobs.items() if life in {"succeeds", "fails once"}}
    failing = set(jobs) - succeeding
    port = free_port()
    worker = kit.workers.start(
        "--concurrency", "8", "--metrics-port", str(port), env={**WORKER_ENV, **level_env}
    )

    def dead_job_ids() -> Counter[str]:
        return Counter(s.letter.job_id or "?" for s in read_dead_letters(kit.settings).letters)

    def ended() -> bool:
        return kit.recording.all_finished(succeeding) and set(dead_job_ids()) >= failing

    assert wait_for(ended, 60), (
        f"jobs did not end: {len(succeeding - kit.recording.finished_ids)} never succeeded, "
        f"{len(failing - set(dead_job_ids()))} never dead-lettered\n{worker.log_tail()}"
    )
    assert dead_job_ids() == Counter(failing), "a job was dead-lettered twice, or wrongly"

    # The counters are updated once a move's transaction committed: wait for them to get there,
    # then compare them per label.
    retries = {("flaky", "retry.0"): 4, ("doomed", "retry.0"): 3}
    dead = {("doomed", "max_attempts"): 3, ("doomed", "fatal_error"): 2}

    def counted() -> bool:
        samples = scrape(port) or {}
        retried, dead_lettered = total(samples, RETRIED), total(samples, DEAD_LETTERED)
        return retried >= sum(retries.values()) and dead_lettered >= sum(dead.values())

    assert wait_for(counted, 10), f"move counters: {scrape(port)}\n{worker.log_tail()}"
    samples = scrape(port) or {}
    assert _by_labels(samples, RETRIED, "type", "route") == retries
    assert _by_labels(samples, DEAD_LETTERED, "type", "reason") == dead

    worker.terminate()  # graceful: flushes the best-effort events before it exits
    assert worker.wait(timeout=60) == 0, worker.log_tail()

    events = _events_by_job(kit.settings)
    expected = {
        job_id: [step for step in LIFECYCLES[life] if step[0] in kinds]
        for job_id, life in jobs.items()
    }
    assert set(events) == {job_id for job_id, steps in expected.items() if steps}, (
        "events of jobs nobody enqueued, or jobs without their events"
    )
    for job_id, job_events in events.items():
        job_type = JOB_TYPES[jobs[job_id]]
        assert {(e.job_type, e.priority) for _, e in job_events} == {(job_type, "default")}
        assert all(e.worker for _, e in job_events), f"job {job_id}: an event names no worker"
        partitions = {partition for partition, _ in job_events}
        assert len(partitions) == 1, f"job {job_id}'s events are in partitions {partitions}"
    got = {
        job_id: [(e.kind, e.attempt) for _, e in job_events]
        for job_id, job_events in events.items()
    }
    # What happened to each job, whatever the order...
    assert {i: Counter(steps) for i, steps in got.items()} == {
        i: Counter(steps) for i, steps in expected.items() if steps
    }
    # ... and in the order it happened, by the ordering docs/failures.md gives (two producers
    # write them, so the log order may differ within an attempt).
    disordered = [
        f"job {job_id} ({jobs[job_id]}): {_describe(job_events)}"
        for job_id, job_events in events.items()
        if [(e.kind, e.attempt) for e in _in_order(job_events)] != expected[job_id]
    ]
    assert not disordered, f"{len(disordered)} jobs' events out of order:\n" + "\n".join(disordered)


def _events_by_job(settings: Settings) -> dict[str, list[tuple[int, Event]]]:
    """Every committed event on ``<ns>.events``, per job id in log order, with its partition."""
    topic = TopicNames(settings.namespace).events
    with _Reader(settings, timeout=30) as reader:
        messages = reader.read(topic)[topic]
    codec = EventCodec()
    by_job: dict[str, list[tuple[int, Event]]] = defaultdict(list)
    for message in sorted(messages, key=lambda m: (m.partition() or 0, m.offset() or 0)):
        event = codec.decode(message.value() or b"")
        assert message.key() == event.job_id.encode(), "an event not keyed by its job id"
        by_job[event.job_id].append((message.partition() or 0, event))
    return by_job


_RANK = {"started": 0, "progress": 1, "succeeded": 2, "retried": 3, "dead": 3}


def _in_order(events: list[tuple[int, Event]]) -> list[Event]:
    """A job's events in the order they happened: attempt, time made, then kind."""
    return sorted((e for _, e in events), key=lambda e: (e.attempt, e.at, _RANK[e.kind]))


def _describe(events: list[tuple[int, Event]]) -> str:
    """Events in log order with the time each was made (ms after the first)."""
    first = min(e.at for _, e in events)
    return ", ".join(f"{e.kind}@{e.attempt} (+{e.at - first} ms)" for _, e in events)


_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _by_labels(samples: dict[str, float], name: str, *labels: str) -> dict[tuple[str, ...], int]:
    """The samples of counter ``name`` keyed by the values of ``labels``, zeros left out."""
    out: dict[tuple[str, ...], int] = {}
    for series, value in samples.items():
        metric, _, rest = series.partition("{")
        if metric == name and value:
            found = dict(_LABEL.findall(rest))
            out[tuple(found.get(label, "") for label in labels)] = int(value)
    return out
