"""``pipeline-scheduler --help`` states the defaults the settings have."""

from __future__ import annotations

from click.testing import CliRunner

from pipeline._schedulersettings import SchedulerSettings
from pipeline_scheduler._cli import main


def test_help_names_the_default_session_timeout() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    default = SchedulerSettings().session_timeout_ms
    text = " ".join(result.output.split())
    assert f"PIPELINE_SCHEDULER__SESSION_TIMEOUT_MS, default {default})" in text
