"""The monitor's background reading, with the Kafka reads replaced: a failing refresh of the
dead-letter index must not stop the readings of the status."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from pipeline import Settings
from pipeline._backlogmodel import GroupMembers
from pipeline._errors import KafkaUnavailableError
from pipeline._status import StatusSnapshot
from pipeline_web import _monitor
from pipeline_web._monitor import Monitor

from .conftest import MakeDashboard

NOW = 1_800_000_000_000


class _NoReader:
    """Stands for the :class:`BacklogReader` the monitor keeps open."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _status(settings: Settings, *, timeout: float, reader: object) -> StatusSnapshot:
    nobody = GroupMembers("g", "EMPTY", ())
    return StatusSnapshot(settings.namespace, NOW, (), (), (), nobody, nobody, 0, ())


def test_a_failing_index_refresh_does_not_stop_the_status_readings(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_monitor, "BacklogReader", _NoReader)
    monkeypatch.setattr(_monitor, "read_status", _status)

    def refresh_too_slow(timeout: float) -> None:  # a step of a deep <ns>.dlq
        raise KafkaUnavailableError("monitored.dlq not read to the end, 3 partition(s) left")

    settings = Settings(namespace="monitored")
    monitor = Monitor(settings, refresh_s=0.2, history_s=10, before=refresh_too_slow)
    monitor.start()
    try:
        reading = monitor.wait(timeout=10)
    finally:
        monitor.stop()
    assert reading is not None
    assert reading.at == NOW
    assert monitor.problem is None
    assert "monitored.dlq not read to the end" in caplog.text
    assert monitor.letters_problem is not None
    assert "monitored.dlq not read to the end" in monitor.letters_problem


def test_the_pages_say_when_the_dead_letters_could_not_be_read(
    make_dashboard: MakeDashboard,
) -> None:
    # A missing READ ACL on <ns>.dlq, say: the overview showed "0 pending" and no word.
    app = make_dashboard("monitored")
    app.state.dashboard.monitor.letters_problem = "monitored.dlq: Topic authorization failed"
    client = TestClient(app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
    for path in ("/", "/dead-letters"):
        page = client.get(path)
        banner = re.search(r'id="letters-problem"[^>]*>(.*?)</p>', page.text, re.S)
        assert banner is not None, (path, page.text)
        assert "Topic authorization failed" in banner.group(1)
