"""``pipeline-scheduler [--app MODULE[:ATTR]] [options]``: run a scheduler (leader or standby)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from pipeline import ConfigurationError, Pipeline, Settings
from pipeline._loader import load_app_for_service
from pipeline._logfmt import configure_logging
from pipeline._settings import check_config_file, settings_error


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE[:ATTR]",
    help="An application whose app.schedule(...) schedules are published, and whose job types' "
    "declared priority and max_attempts are the defaults of cron fires [default: none; "
    "schedules come from the topic alone].",
)
@click.option("--bootstrap-servers", metavar="HOST:PORT,...", help="Kafka to connect to.")
@click.option("--namespace", help="Topic namespace [default: the settings'].")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve /metrics and /healthz on this port (0: any free port) [default: off].",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log level [default: INFO].",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML settings file (as PIPELINE_CONFIG_FILE).",
)
@click.pass_context
def main(
    ctx: click.Context,
    /,
    app_spec: str | None,
    bootstrap_servers: str | None,
    namespace: str | None,
    metrics_port: int | None,
    log_level: str | None,
    config_file: Path | None,
) -> None:
    """Release delayed jobs and fire cron schedules; run two or more for hot standbys.

    Exactly one process of a namespace leads (it owns <namespace>.scheduler-control in the
    group <namespace>.scheduler); the others wait and take over within the session timeout
    (PIPELINE_SCHEDULER__SESSION_TIMEOUT_MS, default 1500) when it dies. SIGTERM hands over
    at once.
    """
    if config_file is not None:
        os.environ["PIPELINE_CONFIG_FILE"] = str(config_file.resolve())
    configure_logging((log_level or "INFO").upper())
    _check_config_file()
    app = load_app_for_service(app_spec) if app_spec else None
    settings = _settings(app, bootstrap_servers, namespace, metrics_port, log_level)
    configure_logging(settings.scheduler.log_level, settings.log_format)
    from ._runtime import Scheduler

    try:
        code = Scheduler(settings, app).run()
    except ConfigurationError as exc:  # the metrics port cannot be served, say
        click.echo(f"Error: {exc}", err=True)
        ctx.exit(exc.exit_code)
    ctx.exit(code)


def _check_config_file() -> None:
    """A config file that is missing or not TOML is a usage error (see
    :func:`pipeline._settings.check_config_file`)."""
    try:
        check_config_file()
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None


def _settings(
    app: Pipeline | None,
    bootstrap_servers: str | None,
    namespace: str | None,
    metrics_port: int | None,
    log_level: str | None,
) -> Settings:
    try:
        base = app.settings if app is not None else Settings()
        data: dict[str, Any] = base.model_dump()
        if bootstrap_servers is not None:
            data["bootstrap_servers"] = bootstrap_servers
        if namespace is not None:
            data["namespace"] = namespace
        if metrics_port is not None:
            data["scheduler"]["metrics_port"] = metrics_port
        if log_level is not None:
            data["scheduler"]["log_level"] = log_level.upper()
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise click.UsageError(str(settings_error(exc))) from None
    except ConfigurationError as exc:  # Settings() read a config file it cannot use
        raise click.UsageError(str(exc)) from None
