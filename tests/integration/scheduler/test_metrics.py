"""An embedded scheduler serves /healthz and /metrics and stops cleanly on stop()."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from confluent_kafka import Producer

from pipeline import Pipeline
from pipeline._schedulersettings import SchedulerSettings
from pipeline._settings import Settings
from pipeline._topics import TopicNames
from pipeline_scheduler import Scheduler
from tests import waiting


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    assert waiting.wait_for(condition, timeout), "condition not met in time"


@contextmanager
def leading(topics: Settings) -> Iterator[int]:
    """An embedded scheduler serving its metrics, once it leads: its metrics port. It stops
    cleanly on stop() (exit code 0) on the way out."""
    settings = topics.model_copy(update={"scheduler": SchedulerSettings(metrics_port=0)})
    scheduler = Scheduler(settings)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(scheduler.run()))
    thread.start()
    try:
        wait_for(lambda: scheduler.is_leader and scheduler.metrics_port is not None)
        assert scheduler.metrics_port is not None
        yield scheduler.metrics_port
    finally:
        scheduler.stop()
        thread.join(30)
    assert codes == [0]


def test_metrics_and_health(topics: Settings) -> None:
    with leading(topics) as port:
        assert get(port, "/healthz").strip() == "leader"
        app = Pipeline(topics)
        for _ in range(3):
            app.enqueue("m.job", {}, delay=0.5)
        app.flush()
        wait_for(lambda: "pipeline_scheduler_releases_total 3.0" in get(port, "/metrics"))
        text = get(port, "/metrics")
        assert "pipeline_scheduler_is_leader 1.0" in text
        assert "pipeline_scheduler_release_lateness_seconds_count 3.0" in text
        assert "pipeline_scheduler_held_jobs 0.0" in text


def test_the_state_records_a_takeover_skips_are_counted(topics: Settings) -> None:
    """Skipped, a bad record may make the new leader release a job or fire a cron schedule a
    second time: the operator sees the count (alert PipelineSchedulerStateSkipped)."""
    names = TopicNames(topics.namespace)
    producer = Producer({"bootstrap.servers": topics.bootstrap_servers})
    producer.produce(names.scheduler_state, b'{"v":1,"last":1e400}', b"cron:nightly")
    producer.produce(names.scheduler_state, b"[" * 10_000, f"offsets:{names.deferred}:0".encode())
    assert producer.flush(30) == 0
    with leading(topics) as port:
        assert "pipeline_scheduler_state_records_skipped_total 2.0" in get(port, "/metrics")
