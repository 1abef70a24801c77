"""The monitor's background reading, with the Kafka reads replaced: a failing refresh of the
dead-letter index must not stop the readings of the status."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import Settings
from pipeline._backlogmodel import GroupMembers
from pipeline._errors import KafkaUnavailableError
from pipeline._status import StatusSnapshot
from pipeline_web import _monitor
from pipeline_web._monitor import Monitor

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
