"""``pipeline exporter`` serves the backlog with no worker running, and sees a worker drain it."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline import Pipeline
from pipeline._admin import apply_topics
from pipeline._settings import Settings
from pipeline._workersettings import WorkerSettings
from pipeline_cli._exporter import Exporter
from pipeline_worker import Worker
from tests import waiting


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(port: int, name: str, **labels: str) -> float | None:
    return scrape(port).get((name, frozenset(labels.items())))


def wait_for(condition: object, what: str, timeout: float = 60) -> None:
    assert callable(condition)
    assert waiting.wait_for(condition, timeout), f"timed out waiting for {what}"


@pytest.fixture
def exporter(settings: Settings) -> Iterator[Exporter]:
    apply_topics(settings)
    runner = Exporter(settings, port=0, interval=0.2, timeout=10)
    thread = threading.Thread(target=runner.run, name="exporter")
    thread.start()
    try:
        wait_for(lambda: runner.port is not None and runner.state.ok, "the exporter's first read")
        yield runner
    finally:
        runner.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_backlog_without_workers_then_drained(settings: Settings, exporter: Exporter) -> None:
    port = exporter.port
    assert port is not None
    app = Pipeline(settings)
    app.job("noop")(lambda: None)

    @app.job("always.fails")
    def always_fails() -> None:
        raise RuntimeError("fails on purpose")

    for _ in range(5):
        app.enqueue("noop", {})
    for _ in range(2):
        app.enqueue("noop", {}, priority="high")
    app.enqueue("no.such.type", {})  # the worker dead-letters it: unknown type
    app.enqueue("noop", {}, delay=3600)  # waits on <ns>.deferred: no scheduler runs
    app.enqueue("always.fails", {})  # moved to the first retry tier, where it stays (no relay)
    app.flush()

    wait_for(lambda: value(port, "pipeline_queue_depth", priority="default") == 7, "depth 7")
    assert value(port, "pipeline_queue_depth", priority="high") == 2
    assert value(port, "pipeline_queue_depth", priority="low") == 0
    age = value(port, "pipeline_queue_oldest_job_age_seconds", priority="default")
    assert age is not None
    assert age > 0
    assert value(port, "pipeline_queue_oldest_job_age_seconds", priority="low") == 0
    deferred = app.topics.deferred
    wait_for(lambda: value(port, "pipeline_deferred_depth", topic=deferred) == 1, "deferred 1")
    workers = f"{settings.namespace}.workers"
    assert value(port, "pipeline_group_members", role="worker", group=workers) == 0
    assert value(port, "pipeline_dead_letters_pending") == 0
    assert value(port, "pipeline_exporter_read_success") == 1
    assert (value(port, "process_open_fds") or 0) > 0

    retry_tier = app.topics.retry(0)
    assert value(port, "pipeline_retry_depth", topic=retry_tier) == 0
    worker_settings = settings.model_copy(
        update={"worker": WorkerSettings(metrics_port=0, retries=False)}
    )
    worker = Worker(app, worker_settings)
    thread = threading.Thread(target=worker.run, name="worker")
    thread.start()
    try:
        wait_for(
            lambda: (
                value(port, "pipeline_queue_depth", priority="default") == 0
                and value(port, "pipeline_queue_depth", priority="high") == 0
            ),
            "the worker to drain the priority topics",
        )
        assert value(port, "pipeline_queue_oldest_job_age_seconds", priority="default") == 0
        wait_for(lambda: value(port, "pipeline_dead_letters_pending") == 1, "one dead letter")
        assert value(port, "pipeline_dead_letters_retained", status="pending") == 1
        assert value(port, "pipeline_dead_letters_retained", status="replayed") == 0
        # One job moved in one transaction: the job, and the transaction's commit marker
        # (offsets are counted, and nothing committed on the tier: no relay runs).
        wait_for(lambda: value(port, "pipeline_retry_depth", topic=retry_tier) == 2, "the retry")
        wait_for(
            lambda: value(port, "pipeline_group_members", role="worker", group=workers) == 1,
            "the worker in the group",
        )
        assert worker.metrics_port is not None
        assert value(worker.metrics_port, "pipeline_worker_utilization_ratio") == 0
    finally:
        worker.stop()
        thread.join(60)
    assert not thread.is_alive()
