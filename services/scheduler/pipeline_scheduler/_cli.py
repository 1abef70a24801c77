"""``pipeline-scheduler [--app MODULE[:ATTR]] [options]``: run a scheduler (leader or standby)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from pipeline import ConfigurationError, Pipeline, Settings
from pipeline._cliargs import Command, config_file_option, not_empty, service_config_file
from pipeline._invalidsettings import settings_error, unused_sections
from pipeline._loader import load_app_for_service
from pipeline._logfmt import configure_logging

UNUSED_SECTIONS = ("worker", "web")
"""Settings the scheduler never reads: invalid ones are warned about, not fatal."""


@click.command(
    cls=Command,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE[:ATTR]",
    callback=not_empty,
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
@config_file_option
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
    configure_logging((log_level or "INFO").upper())
    service_config_file(config_file)
    with unused_sections("pipeline-scheduler", *UNUSED_SECTIONS):
        app = load_app_for_service(app_spec) if app_spec is not None else None
        settings = _settings(app, bootstrap_servers, namespace, metrics_port, log_level)
    configure_logging(settings.scheduler.log_level, settings.log_format)
    from ._runtime import Scheduler

    try:
        code = Scheduler(settings, app).run()
    except ConfigurationError as exc:  # the metrics port cannot be served, say
        click.echo(f"Error: {exc}", err=True)
        ctx.exit(exc.exit_code)
    ctx.exit(code)


def _settings(
    app: Pipeline | None,
    bootstrap_servers: str | None,
    namespace: str | None,
    metrics_port: int | None,
    log_level: str | None,
) -> Settings:
    """The application's settings (else the environment's and the config file's) with the
    command line's options on top, validated; an invalid one names its option."""
    try:
        base = app.settings if app is not None else Settings()
    except ValidationError as exc:
        raise click.UsageError(str(settings_error(exc))) from None
    except ConfigurationError as exc:  # Settings() read a config file it cannot use
        raise click.UsageError(str(exc)) from None
    data: dict[str, Any] = base.model_dump()
    options: dict[str, str] = {}
    if bootstrap_servers is not None:
        data["bootstrap_servers"] = bootstrap_servers
        options["bootstrap_servers"] = "--bootstrap-servers"
    if namespace is not None:
        data["namespace"] = namespace
        options["namespace"] = "--namespace"
    if metrics_port is not None:
        data["scheduler"]["metrics_port"] = metrics_port
        options["scheduler.metrics_port"] = "--metrics-port"
    if log_level is not None:
        data["scheduler"]["log_level"] = log_level.upper()
        options["scheduler.log_level"] = "--log-level"
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise click.UsageError(str(settings_error(exc, options=options))) from None
