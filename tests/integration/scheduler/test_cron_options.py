"""A cron fire of a type declared ``priority="high", max_attempts=2`` takes those options.

The scheduler runs with the application (``--app``), so it knows each type's declared options;
a schedule that names none (from the CLI, or ``app.schedule(...)`` in code) fires jobs with the
type's, and one that names them fires with its own.
"""

from __future__ import annotations

import time

from click.testing import CliRunner

from pipeline._settings import Settings
from pipeline_cli._main import cli

from .conftest import Released, SchedulerFactory, collect, job_consumer

EVERY_2S = "* * * * * */2"
APP = "tests.integration.scheduler.cronapp:app"


def add(settings: Settings, name: str, *options: str) -> None:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    args = ["schedules", "add", name, "--cron", EVERY_2S, "--type", "cron.declared", *options]
    result = CliRunner().invoke(cli, [*args, *common])
    assert result.exit_code == 0, result.output


def test_cron_fires_take_the_declared_options_of_their_type(schedulers: SchedulerFactory) -> None:
    settings = schedulers.settings
    add(settings, "from-cli")
    add(settings, "explicit", "--priority", "low", "--max-attempts", "4")
    consumer = job_consumer(settings)
    scheduler = schedulers.start(app=APP)
    names = {"from-cli", "explicit", "declared-in-code"}
    fired: dict[str, list[Released]] = {}
    try:
        deadline = time.monotonic() + 40
        while set(fired) != names and time.monotonic() < deadline:
            for r in collect(consumer, 10**9, timeout=0.5):
                fired.setdefault(r.job.headers["pipeline-schedule"], []).append(r)
    finally:
        consumer.close()
    assert set(fired) == names, scheduler.output()[-3000:]
    ns = settings.namespace
    for name in ("from-cli", "declared-in-code"):
        assert {(r.topic, r.job.priority.value, r.job.max_attempts) for r in fired[name]} == {
            (f"{ns}.jobs.high", "high", 2)
        }, name
    assert {(r.topic, r.job.priority.value, r.job.max_attempts) for r in fired["explicit"]} == {
        (f"{ns}.jobs.low", "low", 4)
    }
