"""The argument checks the command lines share (:mod:`pipeline._cliargs`), through the
services that call them."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pipeline._cliargs import not_empty
from pipeline_cli import cli
from pipeline_scheduler._cli import main as scheduler
from pipeline_worker._cli import command as worker

SERVICES = {
    # The config file is checked before --app is imported: this module is never looked for.
    "pipeline-worker": (worker, ["--app", "an_app_never_imported"]),
    "pipeline-scheduler": (scheduler, []),
}


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize(
    ("via", "content", "error"),
    [
        ("option", "namespace = [\n", "cannot be read as TOML"),
        ("environment", "namespace = [\n", "cannot be read as TOML"),
        ("environment", None, "(PIPELINE_CONFIG_FILE) does not exist or is not a file"),
    ],
)
def test_a_config_file_a_service_cannot_read_is_a_usage_error_not_a_traceback(
    tmp_path: Path, service: str, via: str, content: str | None, error: str
) -> None:
    # The application's Pipeline() read the file at import: a traceback, before the check.
    command, args = SERVICES[service]
    config = tmp_path / "pipeline.toml"
    if content is not None:
        config.write_text(content)
    env = {}
    if via == "option":
        args = [*args, "--config", str(config)]
    else:
        env["PIPELINE_CONFIG_FILE"] = str(config)
    result = CliRunner().invoke(command, args, env=env)
    assert result.exit_code == 2, result.output
    assert f"Error: config file {config}" in result.output
    assert error in result.output
    assert isinstance(result.exception, SystemExit)


def test_an_empty_value_names_its_parameter() -> None:
    @click.command()
    @click.option("--name", callback=not_empty)
    @click.option("--tag", multiple=True, callback=not_empty)
    def named(name: str | None, tag: tuple[str, ...]) -> None:
        click.echo(f"{name} {tag}")

    assert CliRunner().invoke(named, ["--tag", "a"]).output == "None ('a',)\n"
    for args, hint in [(["--name", " "], "--name"), (["--tag", "a", "--tag", ""], "--tag")]:
        result = CliRunner().invoke(named, args)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for '{hint}': must not be empty" in result.output


UNDECODABLE = "n\udcffb"
"""An argument with the byte 0xff, as Python hands over bytes that are not UTF-8."""


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (cli, ["jobs", "show", UNDECODABLE]),
        (cli, ["schedules", "add", UNDECODABLE, "--cron", "* * * * *", "--type", "t"]),
        (cli, ["--log-level", "INFO", "enqueue", "t", '{"a": "' + UNDECODABLE + '"}']),
        (cli, ["jobs", "show", "x", "--bootstrap-servers", UNDECODABLE]),
        (worker, ["--app", UNDECODABLE]),
        (scheduler, ["--namespace", UNDECODABLE]),
    ],
)
def test_an_argument_that_is_not_utf8_is_a_usage_error_not_a_traceback(
    command: click.Command, args: list[str]
) -> None:
    # Each ended in a traceback (UnicodeEncodeError, SystemError from librdkafka) or exit 1.
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 2, result.output
    assert "n\\xffb" in result.output
    assert "' is not valid UTF-8" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
