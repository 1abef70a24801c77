"""``pipeline schedules add|ls|rm`` against a real Kafka."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline._scheduletable import read_schedule_records, read_schedules
from pipeline._settings import Settings
from pipeline_cli._main import cli


def run(settings: Settings, *args: str) -> str:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    result = CliRunner().invoke(cli, ["schedules", *args, *common])
    assert result.exit_code == 0, result.output
    return result.output


def test_add_ls_rm(topics: Settings) -> None:
    out = run(
        topics, "add", "nightly", "--cron", "0 3 * * *", "--type", "report.build",
        "--payload", '{"kind": "daily"}', "--tz", "Europe/Paris", "--missed", "once",
        "--priority", "high",
    )  # fmt: skip
    assert "schedule nightly saved; next fire " in out
    assert "T03:00:00+0" in out
    run(topics, "add", "often", "--cron", "*/5 * * * *", "--type", "t")
    assert "unchanged" in run(topics, "add", "often", "--cron", "*/5 * * * *", "--type", "t")

    listed = json.loads(run(topics, "ls", "--json"))
    assert [s["name"] for s in listed] == ["nightly", "often"]
    nightly = listed[0]
    assert nightly["timezone"] == "Europe/Paris"
    assert nightly["missed"] == "once"
    assert nightly["priority"] == "high"
    assert json.loads(nightly["payload"]) == {"kind": "daily"}
    assert nightly["next_fire"].endswith(("T03:00:00+01:00", "T03:00:00+02:00"))
    table = run(topics, "ls")
    assert table.splitlines()[0].split()[:3] == ["NAME", "CRON", "TZ"]

    assert "removed" in run(topics, "rm", "nightly")
    assert set(read_schedules(topics)) == {"often"}


def test_bad_input_is_refused_with_a_reason(topics: Settings) -> None:
    common = ["--bootstrap-servers", topics.bootstrap_servers, "--namespace", topics.namespace]
    runner = CliRunner()
    bad_cron = runner.invoke(
        cli, ["schedules", "add", "x", "--cron", "nope", "--type", "t", *common]
    )
    assert bad_cron.exit_code == 2
    assert "invalid cron expression" in bad_cron.output
    bad_tz = runner.invoke(
        cli,
        [
            "schedules",
            "add",
            "x",
            "--cron",
            "* * * * *",
            "--type",
            "t",
            "--tz",
            "Mars/Base",
            *common,
        ],
    )
    assert bad_tz.exit_code == 2
    assert "unknown time zone" in bad_tz.output
    missing = runner.invoke(cli, ["schedules", "rm", "ghost", *common])
    assert missing.exit_code == 1
    assert "no schedule named 'ghost'" in missing.output


def test_a_schedule_that_never_fires_is_refused_and_nothing_is_written(topics: Settings) -> None:
    common = ["--bootstrap-servers", topics.bootstrap_servers, "--namespace", topics.namespace]
    runner = CliRunner()
    never = runner.invoke(
        cli, ["schedules", "add", "x", "--cron", "0 3 30 2 *", "--type", "t", *common]
    )
    assert never.exit_code == 2, never.output
    assert "never fires in the 10 years" in never.output
    assert never.exception is None or isinstance(never.exception, SystemExit)
    assert read_schedule_records(topics) == {}


def test_add_with_app_checks_the_type_and_payload(topics: Settings) -> None:
    common = ["--bootstrap-servers", topics.bootstrap_servers, "--namespace", topics.namespace]
    app = ["--app", "tests.integration.scheduler.cronapp:app"]
    runner = CliRunner()
    unknown = runner.invoke(
        cli, ["schedules", "add", "x", "--cron", "* * * * *", "--type", "nope", *app, *common]
    )
    assert unknown.exit_code == 2, unknown.output
    assert "no job type 'nope' is registered" in unknown.output
    bad_payload = runner.invoke(
        cli,
        ["schedules", "add", "x", "--cron", "* * * * *", "--type", "report.build", *app, *common],
    )
    assert bad_payload.exit_code == 2, bad_payload.output
    assert "invalid payload for job type 'report.build'" in bad_payload.output
    no_app = runner.invoke(
        cli, ["schedules", "add", "x", "--cron", "* * * * *", "--type", "t", "--app", "no.such"]
    )
    assert no_app.exit_code == 2
    assert "cannot import module 'no.such'" in no_app.output
    assert read_schedule_records(topics) == {}
    out = run(
        topics, "add", "r", "--cron", "* * * * *", "--type", "report.build",
        "--payload", '{"kind": "daily"}', *app,
    )  # fmt: skip
    assert "schedule r saved" in out
    assert set(read_schedules(topics)) == {"r"}


def test_add_with_app_saves_where_the_application_s_scheduler_reads(
    topics: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The application sets its namespace and servers in code: the schedule is saved there, not
    in the namespace of the command's environment, where its scheduler would never see it."""
    name = f"schedapp_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        "from pipeline import Pipeline\n"
        f"app = Pipeline(namespace={topics.namespace!r}, "
        f"bootstrap_servers={topics.bootstrap_servers!r})\n"
        "@app.job('t')\n"
        "def t() -> None: ...\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    nowhere = {"PIPELINE_NAMESPACE": "elsewhere", "PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    try:
        result = CliRunner().invoke(
            cli,
            ["schedules", "add", "s", "--cron", "0 3 * * *", "--type", "t", "--app", name],
            env=nowhere,
        )
        assert result.exit_code == 0, result.output
        assert set(read_schedules(topics)) == {"s"}
    finally:
        sys.modules.pop(name, None)
