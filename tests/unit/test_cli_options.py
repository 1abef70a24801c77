"""Option values the CLI refuses up front (exit code 2, what is wrong), before any Kafka call."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline_cli import cli

NOWHERE = {"PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"}
SCHEDULE = ["schedules", "add", "x", "--cron", "* * * * *", "--type", "a"]


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


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        # Each was sent or looked up as given: a job keyed or owned by "", a history of "".
        (["enqueue", "a.b", "--key", ""], "'--key'"),
        (["enqueue", "a.b", "--tenant", " "], "'--tenant'"),
        (["jobs", "show", ""], "'ID'"),
        (["events", "tail", "--job", ""], "'--job'"),
        (["events", "tail", "--type", ""], "'--type'"),
        (["dlq", "show", ""], "'ID'"),
        (["schedules", "rm", ""], "'NAME'"),
        (["schedules", "pause", ""], "'NAME'"),
        (["schedules", "resume", ""], "'NAME'"),
        (["schedules", "trigger", ""], "'NAME'"),
        # Taken as not given: the default group, or a refusal that named an empty host.
        (["exporter", "--group", ""], "'--group'"),
        (["web", "--host", ""], "'--host'"),
    ],
)
def test_an_empty_value_is_a_usage_error(args: list[str], hint: str) -> None:
    result = CliRunner().invoke(cli, args, env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for {hint}: must not be empty" in result.output


@pytest.mark.parametrize("command", ["ls", "replay", "discard"])
@pytest.mark.parametrize("option", ["--since", "--until"])
@pytest.mark.parametrize("value", ["99999999999d", "9999999999999w", "0001-01-01T00:00:00+01:00"])
def test_a_time_no_date_can_hold_is_refused(command: str, option: str, value: str) -> None:
    """99999999999d ago is before the year 1: it was accepted, as no datetime can show it."""
    result = CliRunner().invoke(cli, ["dlq", command, option, value], env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert f"{value!r} is out of range: a time must fall between 0001-01-01 and 9999-12-31" in (
        result.output
    )


def test_a_long_ago_that_a_date_holds_is_accepted() -> None:
    from pipeline_cli._dlq import ls

    context = ls.make_context("ls", ["--since", "5000w", "--until", "9999-12-31"])
    assert context.params["since"] is not None
    assert context.params["until"] == 253_402_214_400_000


@pytest.mark.parametrize("at", ["99999999999999999999", "253402300800000"])
def test_a_trigger_time_no_date_can_hold_is_refused(at: str) -> None:
    # An epoch of 20 digits went on to a 64-bit field of the job.
    result = CliRunner().invoke(cli, ["schedules", "trigger", "nightly", "--at", at], env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert "is out of range" in result.output


@pytest.mark.parametrize("at", ["²", "١٢٣", "-5", " ", "yesterday"])
def test_a_trigger_time_of_other_digits_is_refused_with_a_reason(at: str) -> None:
    # "²" is a digit to Python and no number to int(): a traceback, exit 1. The reason named
    # "a duration ago (e.g. 30m, 2h, 7d)" as accepted, which --at refuses.
    result = CliRunner().invoke(cli, ["schedules", "trigger", "nightly", "--at", at], env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--at'" in result.output
    assert "neither an ISO-8601 datetime" in result.output
    assert "nor epoch milliseconds" in result.output
    assert "duration" not in result.output


@pytest.mark.parametrize(
    ("args", "error"),
    [
        # The library refused it only once the job was built (delay), or after Kafka (the
        # schedule's attempts, an Avro int); the poll interval waited for ever (inf).
        (["enqueue", "a.b", "--delay", "1e300"], "1e+300 is not in the range 0<=x<="),
        (["enqueue", "a.b", "--max-attempts", "2147483648"], "not in the range 1<=x<=2147483647"),
        ([*SCHEDULE, "--max-attempts", "99999999999999"], "not in the range 1<=x<=2147483647"),
        (
            ["outbox", "relay", "--dsn", "sqlite:///unused.db", "--poll-interval", "inf"],
            "not a finite number of seconds",
        ),
        # Python's int and json parsing raised past the usage error: tracebacks.
        (["enqueue", "a.b", "--payload", '{"a": ' + "9" * 5000 + "}"], "cannot read"),
        (["enqueue", "a.b", "--payload", "[" * 100_000], "cannot read"),
        ([*SCHEDULE, "--payload", '{"a": ' + "[" * 100_000], "cannot read"),
        (["schedules", "trigger", "x", "--at", "1" * 5000], "out of range for epoch"),
    ],
)
def test_a_number_too_large_to_carry_is_a_usage_error(args: list[str], error: str) -> None:
    result = CliRunner().invoke(cli, args, env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert error in result.output


@pytest.mark.parametrize("command", [["dlq", "stats"], ["topics", "describe"], ["enqueue", "a.b"]])
def test_an_invalid_option_value_is_named_by_its_option_not_the_variable(
    command: list[str],
) -> None:
    """With PIPELINE_NAMESPACE set too, the error blamed the variable for the option's value."""
    result = CliRunner().invoke(
        cli,
        [*command, "--namespace", "bad namespace!"],
        env={**NOWHERE, "PIPELINE_NAMESPACE": "fine"},
    )
    assert result.exit_code == 2, result.output
    assert "invalid settings: namespace (option --namespace): String should match" in (
        result.output
    )
    assert "PIPELINE_NAMESPACE" not in result.output


def test_dev_down_purge_does_not_claim_to_delete_a_folder_that_is_not_there(
    tmp_path: Path,
) -> None:
    missing = tmp_path / "never-made"
    result = CliRunner().invoke(cli, ["dev", "down", "--data-dir", str(missing), "--purge"])
    assert result.exit_code == 0, result.output
    assert "Deleted" not in result.output
    assert f"Nothing to delete: {missing} is no folder." in result.output


def test_an_enqueue_kafka_refuses_is_reported_once_not_again_at_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A wrong password printed the error, then at exit "1 enqueued job(s) never reached Kafka
    ... Call app.flush() before exiting": advice for a script, about the same job."""
    from pipeline import KafkaAuthenticationError, Pipeline, _exitflush

    submitted: list[Pipeline] = []

    class Refused:
        def wait(self) -> None:
            raise KafkaAuthenticationError("Kafka refused user alice: wrong password", "SASL")

    def submit(self: Pipeline, *args: object, **kwargs: object) -> Refused:
        _exitflush.watch(self)  # as an enqueue does: its jobs are flushed at exit
        submitted.append(self)
        return Refused()

    monkeypatch.setattr(Pipeline, "submit", submit)
    result = CliRunner().invoke(cli, ["enqueue", "a.b", "--payload", "{}"], env=NOWHERE)
    assert result.exit_code == 4, result.output
    assert result.output.count("Kafka refused user alice") == 1
    [app] = submitted
    assert app not in _exitflush._watched


def test_a_port_in_use_is_a_usage_error_as_for_the_other_servers() -> None:
    """`pipeline exporter`, the worker and the scheduler exit 2 for it; `pipeline web` exited 1."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["web", "--port", str(port)], env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.output
