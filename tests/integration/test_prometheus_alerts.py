"""A real Prometheus scrapes the exporter, the scheduler and a worker on loopback: the backlog
alert of ops/prometheus/alerts.yml fires while no worker runs and resolves once one drains it.

The rules are those of alerts.yml with one change: PipelineBacklogHigh's ``for: 5m`` becomes
``for: 2s`` (its threshold, expression and labels stay as they are), so the test waits seconds.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import Pipeline
from pipeline._admin import apply_topics
from pipeline._schedulersettings import SchedulerSettings
from pipeline._settings import Settings
from pipeline._workersettings import WorkerSettings
from pipeline_cli._exporter import Exporter
from pipeline_scheduler import Scheduler
from pipeline_worker import Worker
from tests import waiting
from tests.integration.prometheus_server import PrometheusServer, start_prometheus
from tests.integration.worker.harness.metrics import free_port

RULES = Path(__file__).resolve().parents[2] / "ops" / "prometheus" / "alerts.yml"
ALERT = "PipelineBacklogHigh"
THRESHOLD = 1000


def with_short_for(text: str, alert: str, duration: str) -> str:
    """``text`` with the first ``for:`` of rule ``alert`` set to ``duration``."""
    pattern = re.compile(rf"(- alert: {alert}\n(?:\s+(?!- alert:).*\n)*?\s+for: )\S+")
    changed, count = pattern.subn(rf"\g<1>{duration}", text, count=1)
    assert count == 1, f"no for: in rule {alert}"
    return changed


class Threads:
    """Services run on threads of the test process, each stopped and joined at the end."""

    def __init__(self) -> None:
        self._running: list[tuple[threading.Thread, Exporter | Scheduler | Worker]] = []

    def start(self, name: str, service: Exporter | Scheduler | Worker) -> None:
        thread = threading.Thread(target=service.run, name=name)
        thread.start()
        self._running.append((thread, service))

    def stop_all(self) -> None:
        for thread, service in reversed(self._running):
            service.stop()
            thread.join(60)
            assert not thread.is_alive(), f"{thread.name} did not stop"


@pytest.fixture
def threads() -> Iterator[Threads]:
    running = Threads()
    try:
        yield running
    finally:
        running.stop_all()


def wait_until(condition: object, what: str, prometheus: PrometheusServer, timeout: float) -> None:
    assert callable(condition)
    if not waiting.wait_for(condition, timeout, interval=0.2):
        raise AssertionError(
            f"timed out after {timeout:g}s waiting for {what}; targets "
            f"{prometheus.targets_up()}, alerts {prometheus.api('alerts')['alerts']}\n"
            f"{prometheus.output()}"
        )


def firing(prometheus: PrometheusServer, priority: str) -> bool:
    return any(
        a["state"] == "firing" and a["labels"].get("priority") == priority
        for a in prometheus.alerts(ALERT)
    )


def test_backlog_alert_fires_without_workers_and_resolves_when_drained(
    settings: Settings, tmp_path: Path, threads: Threads
) -> None:
    apply_topics(settings)
    rules = tmp_path / "alerts.yml"
    rules.write_text(with_short_for(RULES.read_text(), ALERT, "2s"))

    exporter = Exporter(settings, port=0, interval=0.5, timeout=10)
    scheduler = Scheduler(
        settings.model_copy(update={"scheduler": SchedulerSettings(metrics_port=0)})
    )
    threads.start("exporter", exporter)
    threads.start("scheduler", scheduler)
    assert waiting.wait_for(
        lambda: exporter.port is not None and scheduler.metrics_port is not None, 30
    ), "the exporter and the scheduler did not serve /metrics"
    assert exporter.port is not None
    assert scheduler.metrics_port is not None
    worker_port = free_port()  # scraped (down) before the worker starts, as in production
    prometheus = start_prometheus(
        tmp_path,
        {
            "exporter": [exporter.port],
            "scheduler": [scheduler.metrics_port],
            "worker": [worker_port],
        },
        rules,
    )
    try:
        app = Pipeline(settings)
        app.job("noop")(lambda: None)
        for _ in range(THRESHOLD + 1):
            app.enqueue("noop", {})
        app.flush()

        wait_until(lambda: firing(prometheus, "default"), f"{ALERT} firing", prometheus, 60)
        depth = prometheus.query('pipeline_queue_depth{priority="default"}')
        assert [float(s["value"][1]) for s in depth] == [THRESHOLD + 1]
        assert not firing(prometheus, "high")
        leader = prometheus.query('pipeline_scheduler_is_leader{job="scheduler"}')
        assert [s["value"][1] for s in leader] == ["1"]
        members = prometheus.query('pipeline_group_members{job="exporter"}')
        assert {s["metric"]["role"]: s["value"][1] for s in members} == {
            "worker": "0",
            "scheduler": "1",
        }
        assert not prometheus.alerts("PipelineNoSchedulerLeader")

        worker_settings = settings.model_copy(
            update={"worker": WorkerSettings(metrics_port=worker_port)}
        )
        threads.start("worker", Worker(app, worker_settings))
        # Resolved with the backlog drained: a scrape of the exporter that timed out (1 s, on a
        # loaded machine) also ends the alert, with no depth series at all for a moment.
        wait_until(
            lambda: (
                not prometheus.alerts(ALERT)
                and bool(prometheus.query('pipeline_queue_depth{priority="default"} == 0'))
            ),
            f"{ALERT} resolved, the backlog drained",
            prometheus,
            90,
        )
        wait_until(
            lambda: bool(prometheus.query('pipeline_worker_utilization_ratio{job="worker"}')),
            "the worker scraped",
            prometheus,
            30,
        )
        fds = prometheus.query('process_open_fds{job="worker"}')
        assert fds
        assert float(fds[0]["value"][1]) > 0
    finally:
        prometheus.stop()
    assert prometheus.process.returncode == 0, prometheus.output()
