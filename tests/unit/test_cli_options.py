"""Option values the CLI refuses up front (exit code 2, what is wrong), before any Kafka call."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline_cli import cli

NOWHERE = {"PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"}


@pytest.mark.parametrize(
    ("args", "error"),
    [
        # librdkafka takes at most an hour: a longer wait gave a traceback.
        (["topics", "describe", "--timeout", "4000"], "not in the range"),
        (["dlq", "stats", "--timeout", "1e9"], "not in the range"),
        # inf and nan passed click's FloatRange: tracebacks, or a read of Kafka without pause.
        (["enqueue", "a.b", "--timeout", "inf"], "not a finite number of seconds"),
        (["enqueue", "a.b", "--delay", "nan"], "not a finite number of seconds"),
        (["status", "--watch", "inf"], "not a finite number of seconds"),
        (["exporter", "--interval", "nan"], "not a finite number of seconds"),
        (["topics", "describe", "--timeout", "soon"], "not a valid number of seconds"),
    ],
)
def test_a_duration_must_be_a_finite_number_of_seconds_in_range(
    args: list[str], error: str
) -> None:
    result = CliRunner().invoke(cli, args, env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert error in result.output


def test_an_app_whose_import_fails_is_a_usage_error_that_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_app_mod.py").write_text("import a_module_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        cli, ["enqueue", "a.b", "--app", "broken_app_mod", "--payload", "{}"], env=NOWHERE
    )
    assert result.exit_code == 2, result.output
    assert "importing the application failed: ModuleNotFoundError" in result.output


def test_a_manual_trigger_is_named_by_a_time_not_a_duration_ago() -> None:
    """`--at 1h` was another time at every run: a repeated trigger ran the job again."""
    result = CliRunner().invoke(cli, ["schedules", "trigger", "nightly", "--at", "1h"], env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert "a duration ago" in result.output


@pytest.mark.parametrize("command", ["ls", "replay", "discard"])
@pytest.mark.parametrize("option", ["--since", "--until"])
def test_a_duration_ago_too_long_for_a_time_is_refused(command: str, option: str) -> None:
    """A duration of hundreds of digits is an infinite float: an OverflowError traceback."""
    result = CliRunner().invoke(cli, ["dlq", command, option, "9" * 400 + "s"], env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert "out of range" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("servers", ["", " ", " , "])
@pytest.mark.parametrize("command", [["dlq", "stats"], ["topics", "describe"], ["enqueue", "a.b"]])
def test_bootstrap_servers_naming_no_server_are_refused(command: list[str], servers: str) -> None:
    """`--bootstrap-servers "$UNSET"` waited out --timeout, then blamed Kafka at "" for it."""
    result = CliRunner().invoke(
        cli, [*command, "--bootstrap-servers", servers, "--timeout", "0.5"], env=NOWHERE
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--bootstrap-servers'" in result.output


def test_an_unknown_dead_letter_reason_is_refused_not_matched_to_nothing() -> None:
    # `replay --reason max_attempt` (a typo) said "nothing to replay" and exited 0.
    result = CliRunner().invoke(
        cli, ["dlq", "replay", "--reason", "max_attempt", "--yes"], env=NOWHERE
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--reason': 'max_attempt' is not one of" in result.output


def test_a_dead_letter_reason_is_matched_case_insensitively() -> None:
    from pipeline_cli._dlq import ls

    context = ls.make_context("ls", ["--reason", "MAX_ATTEMPTS", "--reason", "Timeout"])
    assert context.params["reasons"] == ("max_attempts", "timeout")


def test_a_header_given_twice_is_refused_not_overwritten() -> None:
    # The second value silently replaced the first: the job went out with one of them.
    result = CliRunner().invoke(
        cli, ["enqueue", "a.b", "--header", "team=a", "--header", "team=b"], env=NOWHERE
    )
    assert result.exit_code == 2, result.output
    assert "header 'team' is given twice" in result.output
