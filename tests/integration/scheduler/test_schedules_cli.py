"""``pipeline schedules add|ls|rm`` against a real Kafka."""

from __future__ import annotations

import json

from click.testing import CliRunner

from pipeline._schedule import read_schedules
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
    assert bad_cron.exit_code == 1
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
    assert "unknown time zone" in bad_tz.output
    missing = runner.invoke(cli, ["schedules", "rm", "ghost", *common])
    assert missing.exit_code == 1
    assert "no schedule named 'ghost'" in missing.output
