"""``pipeline schedules pause|resume|trigger`` against a real Kafka."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from pipeline._schedule import make_schedule
from pipeline._scheduletable import publish_schedules, read_schedules
from pipeline._settings import Settings
from pipeline_cli._main import cli

from .conftest import collect, job_consumer


def invoke(settings: Settings, *args: str) -> Result:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    return CliRunner().invoke(cli, ["schedules", *args, *common])


def run(settings: Settings, *args: str) -> str:
    result = invoke(settings, *args)
    assert result.exit_code == 0, result.output
    return result.output


def test_pause_resume_and_trigger(topics: Settings) -> None:
    run(topics, "add", "nightly", "--cron", "0 3 * * *", "--type", "report.build")
    assert run(topics, "pause", "nightly") == "schedule nightly paused\n"
    assert run(topics, "pause", "nightly") == "schedule nightly was paused already\n"
    [row] = json.loads(run(topics, "ls", "--json"))
    assert (row["enabled"], row["paused"], row["next_fire"]) == (False, True, None)
    assert run(topics, "ls").splitlines()[1].split()[-1] == "paused"
    # Adding it again (or an application publishing it) keeps it paused.
    added = run(topics, "add", "nightly", "--cron", "0 4 * * *", "--type", "report.build")
    assert added == "schedule nightly saved; paused (`pipeline schedules resume nightly`)\n"
    assert read_schedules(topics)["nightly"].enabled is False
    assert json.loads(run(topics, "resume", "nightly", "--json")) == {
        "name": "nightly",
        "state": "resumed",
        "changed": True,
    }
    assert read_schedules(topics)["nightly"].enabled is True
    assert read_schedules(topics)["nightly"].cron == "0 4 * * *"

    consumer = job_consumer(topics)
    try:
        job_id = run(topics, "trigger", "nightly").strip()
        triggered = json.loads(run(topics, "trigger", "nightly", "--at", "1700000000000", "--json"))
        released = collect(consumer, 2, timeout=20)
    finally:
        consumer.close()
    assert len(job_id) == 32
    assert triggered["idempotency_key"] == "manual:nightly:1700000000000"
    assert {r.job.id for r in released} == {job_id, triggered["id"]}
    assert all(r.job.headers["pipeline-trigger"] == "manual" for r in released)


def test_an_unknown_name_is_an_error_that_names_it(topics: Settings) -> None:
    publish_schedules(topics, [make_schedule("known", cron="0 3 * * *", job_type="t")])
    for command in ("pause", "resume", "trigger"):
        result = invoke(topics, command, "nope")
        assert result.exit_code == 1, (command, result.output)
        assert "no schedule named 'nope'" in result.output, command
    bad_at = invoke(topics, "trigger", "known", "--at", "yesterday-ish")
    assert bad_at.exit_code == 2
    assert "epoch milliseconds" in bad_at.output
