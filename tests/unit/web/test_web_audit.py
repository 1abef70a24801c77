"""The audit log file: an action that ran answers as it ran when its line cannot be written
(an error page would have the operator run it again), and a dashboard whose file cannot be
appended to does not start."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline._errors import ConfigurationError
from pipeline_web import _schedules, create_app
from pipeline_web._schedules import ScheduleRow

from .conftest import MakeDashboard
from .test_web_pages import _client, _csrf, _schedule

if TYPE_CHECKING:
    from pathlib import Path


def test_an_action_whose_audit_line_cannot_be_written_still_answers_it_ran(
    make_dashboard: MakeDashboard,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = [ScheduleRow("nightly", _schedule("nightly"), None, None, [], "")]
    monkeypatch.setattr(_schedules, "read_rows", lambda settings, timeout: rows)
    paused: list[str] = []

    def pause(settings: Settings, name: str, timeout: float) -> bool:
        paused.append(name)
        return True  # it was not paused: the record was written

    monkeypatch.setattr(_schedules, "pause_schedule", pause)
    audit_log = tmp_path / "audit.jsonl"
    app = make_dashboard("audit", audit_log=str(audit_log))
    audit_log.unlink()
    audit_log.mkdir()  # appending to it now fails, as a full disk or a revoked permission would
    client = _client(app)
    with caplog.at_level(logging.INFO, logger="pipeline.web.audit"):
        answer = client.post("/schedules/pause?name=nightly", data={"csrf": _csrf(client)})
    assert answer.status_code == 303
    assert "paused" in answer.headers["location"]
    assert paused == ["nightly"]
    # Only the audit logger's lines: other tests' threads may log meanwhile.
    audit = [r for r in caplog.records if r.name == "pipeline.web.audit"]
    (failure,) = [r for r in audit if r.levelno == logging.ERROR]
    assert "schedule.pause" in failure.getMessage()
    assert str(audit_log) in failure.getMessage()
    (logged,) = [r for r in audit if r.levelno == logging.INFO]
    assert json.loads(logged.getMessage())["action"] == "schedule.pause"  # on the logger still


def test_a_dashboard_whose_audit_log_cannot_be_appended_to_does_not_start(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "no-such-dir" / "audit.jsonl"
    settings = Settings(
        bootstrap_servers="127.0.0.1:1", namespace="audit", web={"audit_log": str(missing)}
    )
    with pytest.raises(ConfigurationError, match=r"web\.audit_log: cannot append to") as refused:
        create_app(settings, timeout=0.5)
    assert str(missing) in str(refused.value)


def test_pipeline_web_exits_2_when_its_audit_log_cannot_be_appended_to(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import uvicorn
    from click.testing import CliRunner

    from pipeline_cli._main import cli

    def serve(*args: object, **kwargs: object) -> None:
        raise AssertionError("pipeline web served without its audit log")

    monkeypatch.setattr(uvicorn.Server, "run", serve)
    missing = tmp_path / "no-such-dir" / "audit.jsonl"
    result = CliRunner().invoke(
        cli, ["web", "--port", "0"], env={"PIPELINE_WEB__AUDIT_LOG": str(missing)}
    )
    assert result.exit_code == 2, result.output
    assert f"web.audit_log: cannot append to {missing}" in result.output
