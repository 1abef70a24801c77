"""Secrets are never shown: every command, run with known secrets in every secret-looking place,
prints none of them, in its output, its logs, its metrics or the dashboard's pages.

The ``pipeline`` commands come from click's command tree (a new command is covered without
a change here): each one's ``--help``, then a representative run (``--json`` where it has it)
once with valid settings holding secrets and once with invalid ones (a misspelled secret's
name, a secret beside a missing user name, a passthrough that is no mapping).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import click
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from pipeline import Pipeline, Settings
from pipeline_cli._main import cli
from pipeline_scheduler._cli import main as scheduler_main
from pipeline_web import create_app
from pipeline_worker._cli import command as worker_main
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

pytestmark = pytest.mark.kafka

MARK = f"leak{uuid.uuid4().hex[:10]}"
"""Every secret holds this: finding it anywhere is a leak."""

GOOD_ENV = {
    "PIPELINE_SECURITY__SASL_USERNAME": "svc",
    "PIPELINE_SECURITY__SASL_PASSWORD": f"{MARK}-sasl",
    "PIPELINE_SECURITY__SSL_KEY_PASSWORD": f"{MARK}-sslkey",
    "PIPELINE_FOO_TOKEN": f"{MARK}-unknown",
    "PIPELINE_KAFKA": f'{{"sasl.password": "{MARK}-passthrough"}}',
    "PIPELINE_WEB__TOKEN": f"{MARK}-webtoken",
    "PIPELINE_WEB__USERNAME": "admin",
    "PIPELINE_WEB__PASSWORD": f"{MARK}-webpassword",
    "PIPELINE_SCHEMA_REGISTRY__CLIENT": f'{{"basic.auth.user.info": "user:{MARK}-registry"}}',
}
BAD_ENV = {
    **GOOD_ENV,
    "PIPELINE_SECURITY__SASL_PASSWRD": f"{MARK}-misspelled",
    "PIPELINE_WEB__USERNAME": "",
    "PIPELINE_KAFKA": f'["sasl.password", "{MARK}-notamapping"]',
}
del BAD_ENV["PIPELINE_WEB__USERNAME"]

PLACEHOLDERS = {"cron": "*/5 * * * *", "job_type": "leak.check", "payload": "{}"}
"""Values of required parameters where ``x`` cannot do."""

NOT_RUN_HERE = {
    ("dev", "up"): "starts a broker",
    ("web",): "serves until stopped: its pages are read below",
    ("exporter",): "serves until stopped: run as a process below",
}
EXTRA_ARGS = {
    ("events", "tail"): ["--from-beginning", "--until-idle", "1"],
    ("enqueue",): ["--payload", '{"n": 1}'],
}

APP = """
from pathlib import Path

from pipeline import Pipeline

app = Pipeline()


@app.job("leak.check")
def check(n: int) -> None:
    Path(__file__).with_name("ran").write_text(str(n))
"""


def leaf_commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


def representative(path: tuple[str, ...], command: click.Command, tmp: Path) -> list[str]:
    """``path`` with each required parameter given, ``--json`` where the command has it."""
    args = ["--log-level", "DEBUG", *path]
    for param in command.params:
        if not param.required or param.name is None:
            continue
        value = PLACEHOLDERS.get(param.name, "x")
        args += [value] if isinstance(param, click.Argument) else [param.opts[0], value]
    options = {opt for param in command.params for opt in param.opts}
    if "--json" in options:
        args.append("--json")
    if "--data-dir" in options:
        args += ["--data-dir", str(tmp / "dev")]  # never the default one
    if "--timeout" in options:
        args += ["--timeout", "5"]
    return args + EXTRA_ARGS.get(path, [])


def assert_no_secret(text: str, what: str) -> None:
    assert MARK not in text, f"a secret leaked in {what}:\n{text}"


@pytest.fixture
def environment(
    bootstrap_servers: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Mapping[str, str]:
    base = {"PIPELINE_BOOTSTRAP_SERVERS": bootstrap_servers, "PIPELINE_NAMESPACE": namespace}
    for name in [*BAD_ENV, *GOOD_ENV]:
        monkeypatch.delenv(name, raising=False)
    return base


def run_commands(env: Mapping[str, str], tmp: Path, caplog: pytest.LogCaptureFixture) -> int:
    """Run every ``pipeline`` command's representative invocation; return how many ran."""
    runner = CliRunner()
    ran = 0
    first = [(("topics", "apply"), cli.commands["topics"].commands["apply"])]  # type: ignore[attr-defined]
    for path, command in [*first, *leaf_commands(cli)]:
        if path in NOT_RUN_HERE:
            continue
        args = representative(path, command, tmp)
        caplog.clear()
        result = runner.invoke(cli, args, env=dict(env))
        text = f"{result.output}{result.exception!r}{caplog.text}"
        assert_no_secret(text, f"pipeline {' '.join(args)}")
        ran += 1
    return ran


def test_no_command_help_or_error_shows_a_secret(
    environment: Mapping[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    runner = CliRunner()
    helps: list[tuple[click.Command, list[str]]] = [
        (cli, [*path, "--help"]) for path, _ in leaf_commands(cli)
    ]
    helps += [(worker_main, ["--help"]), (scheduler_main, ["--help"])]
    for command, args in helps:
        result = runner.invoke(command, args, env={**environment, **GOOD_ENV})
        assert result.exit_code == 0, result.output
        assert_no_secret(result.output, " ".join(args))
    # Invalid settings: every command fails on them without repeating a value.
    bad = {**environment, **BAD_ENV}
    for path, command in leaf_commands(cli):
        if path == ("dev", "up"):
            continue
        result = runner.invoke(cli, representative(path, command, tmp_path), env=bad)
        assert_no_secret(f"{result.output}{result.exception!r}{caplog.text}", " ".join(path))
    failing = runner.invoke(cli, ["status", "--json"], env=bad)
    assert failing.exit_code == 2
    assert "security.sasl_passwrd" in failing.output  # named, not shown
    # Valid settings holding secrets: every command runs against the broker.
    assert run_commands({**environment, **GOOD_ENV}, tmp_path, caplog) > 15
    settings = Settings()
    assert_no_secret(repr(settings) + str(settings), "repr(Settings)")


def services(env: Mapping[str, str], tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=tmp,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


def test_services_their_logs_metrics_and_the_dashboard_show_no_secret(
    environment: Mapping[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "leakapp.py").write_text(APP)
    for name, value in {**environment, **GOOD_ENV}.items():
        monkeypatch.setenv(name, value)
    bad, good = {**environment, **BAD_ENV}, {**environment, **GOOD_ENV}
    applied = CliRunner().invoke(cli, ["topics", "apply"])
    assert applied.exit_code == 0, applied.output
    for service in ("pipeline_worker", "pipeline_scheduler"):
        failed = services(bad, tmp_path, "-m", service, "--app", "leakapp:app")
        assert failed.returncode == 2, failed.stderr
        assert_no_secret(failed.stdout + failed.stderr, f"{service} with bad settings")

    worker_port, exporter_port = free_port(), free_port()
    child_env = {**os.environ, **good, "PYTHONPATH": str(tmp_path)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "pipeline_worker", "--app", "leakapp:app", "--log-level",
         "DEBUG", "--metrics-port", str(worker_port)],
        cwd=tmp_path, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    exporter = subprocess.Popen(
        [str(Path(sys.executable).with_name("pipeline")), "--log-level", "DEBUG", "exporter",
         "--metrics-port", str(exporter_port), "--interval", "0.5"],
        cwd=tmp_path, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        app = Pipeline()  # with every secret
        app.enqueue("leak.check", {"n": 7})
        app.flush(30)
        assert wait_for(lambda: (tmp_path / "ran").exists() or worker.poll() is not None, 60)
        assert worker.poll() is None, "the worker exited"
        worker_metrics = scrape(worker_port)
        assert "pipeline_" in worker_metrics
        assert wait_for(lambda: "pipeline_" in scrape(exporter_port), 30)
        exporter_metrics = scrape(exporter_port)
        with TestClient(create_app(Settings()), base_url="http://127.0.0.1") as client:
            pages = [
                client.get(page, headers={"Authorization": f"Bearer {good['PIPELINE_WEB__TOKEN']}"})
                for page in ("/", "/workers", "/jobs?id=x", "/dead-letters", "/schedules", "/login")
            ]
        assert pages[0].status_code == 200, pages[0].text
    finally:
        for process in (worker, exporter):
            process.send_signal(signal.SIGTERM)
        outputs = [process.communicate(timeout=60)[0] for process in (worker, exporter)]
    assert "worker starting" in outputs[0], outputs[0]
    assert_no_secret(outputs[0], "the worker's log")
    assert_no_secret(outputs[1], "the exporter's log")
    assert_no_secret(worker_metrics, "the worker's /metrics")
    assert_no_secret(exporter_metrics, "the exporter's /metrics")
    for page in pages:
        assert_no_secret(page.text, f"the dashboard's {page.url}")
