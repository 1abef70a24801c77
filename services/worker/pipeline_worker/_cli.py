"""``pipeline-worker --app MODULE[:ATTR] [options]``: run a worker (or N supervised ones)."""

from __future__ import annotations

import gc
import logging
import os
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from pipeline import ConfigurationError, Pipeline, Priority, Settings
from pipeline._cliargs import Command, config_file_option, not_empty, service_config_file
from pipeline._invalidsettings import settings_error, unused_sections
from pipeline._loader import load_app_for_service
from pipeline._logfmt import configure_logging
from pipeline._workersettings import WorkerSettings

from . import _signals

_log = logging.getLogger("pipeline.worker")

# Options that map to WorkerSettings fields of the same name (the CLI wins over settings).
WORKER_OPTIONS = (
    "group_id",
    "priorities",
    "policy",
    "weights",
    "concurrency",
    "threads",
    "processes",
    "burst",
    "key_ordering",
    "metrics_port",
    "log_level",
)
PRIORITY_NAMES = ", ".join(p.value for p in Priority)
UNUSED_SECTIONS = ("scheduler", "web")
"""Settings the worker never reads: invalid ones are warned about, not fatal."""


def _priorities(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [v.strip().lower() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter(f"give one or more of {PRIORITY_NAMES}, comma-separated")
    for name in names:
        if name not in {p.value for p in Priority}:
            raise click.BadParameter(f"unknown priority {name!r}; use {PRIORITY_NAMES}")
    if len(set(names)) != len(names):
        raise click.BadParameter(f"a priority is repeated in {value!r}")
    return names


def _weights(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        weights = [int(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers") from None
    if len(weights) != len(Priority) or any(w < 1 for w in weights):
        raise click.BadParameter(
            f"give {len(Priority)} positive integers, one per priority in the order "
            f"{PRIORITY_NAMES} (e.g. 10,5,3,1), got {value!r}"
        )
    return weights


@click.command(
    cls=Command,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--app",
    "app_spec",
    required=True,
    metavar="MODULE[:ATTR]",
    help="The application: a module and its pipeline.Pipeline attribute (default: app).",
)
@click.option(
    "--group",
    "group_id",
    metavar="NAME",
    callback=not_empty,
    help="Consumer group [default: <namespace>.workers].",
)
@click.option(
    "--priorities",
    callback=_priorities,
    metavar="LIST",
    help=f"Priorities to consume, in strict order [default: {PRIORITY_NAMES}].",
)
@click.option(
    "--policy",
    type=click.Choice(["strict", "weighted"]),
    help="strict: higher priorities first; weighted: shares by --weights [default: weighted].",
)
@click.option(
    "--weights",
    callback=_weights,
    metavar="C,H,D,L",
    help=(
        "Weights of critical,high,default,low for --policy weighted, and for the jobs waiting "
        "for a job type's or tenant's limit under either policy [default: 10,5,3,1]."
    ),
)
@click.option(
    "--concurrency", type=click.IntRange(min=1), help="Jobs in flight per process [default: 64]."
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    help="Most threads for plain-function handlers, started on demand [default: the concurrency].",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    help="Worker processes (group members) to run and supervise [default: 1].",
)
@click.option(
    "--burst/--no-burst", default=None, help="Exit 0 once every assigned partition is drained."
)
@click.option(
    "--key-ordering/--no-key-ordering",
    default=None,
    help="Jobs with the same Kafka key run one at a time, in order [default: off].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve /metrics and /healthz on this port (0: any free port) [default: off].",
)
@click.option("--bootstrap-servers", metavar="HOST:PORT,...", help="Kafka to connect to.")
@click.option("--namespace", help="Topic namespace [default: the application's].")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    help="Log level [default: INFO].",
)
@config_file_option
@click.option("--child-index", type=int, hidden=True)
@click.pass_context
def command(
    ctx: click.Context,
    /,
    app_spec: str,
    config_file: Path | None,
    child_index: int | None,
    bootstrap_servers: str | None,
    namespace: str | None,
    **options: Any,
) -> None:
    """Run the jobs of a pipeline application.

    Joins the consumer group on the priority topics (<namespace>.jobs.<priority>) and runs
    jobs until SIGTERM or SIGINT (a second signal exits at once). Every option can also be set
    with the environment (PIPELINE_WORKER__CONCURRENCY=100, PIPELINE_BOOTSTRAP_SERVERS=...) or
    the config file; the command line wins.
    """
    service_config_file(config_file)
    level = options["log_level"] or os.environ.get("PIPELINE_WORKER__LOG_LEVEL", "INFO")
    configure_logging(level.upper() if level.upper() in logging.getLevelNamesMapping() else "INFO")
    with unused_sections("pipeline-worker", *UNUSED_SECTIONS):
        app = load_app_for_service(app_spec)
        if _signals.received():
            _log.info("stopped before starting")
            ctx.exit(0)
        settings = _settings(app, bootstrap_servers, namespace, options)
    configure_logging(settings.worker.log_level, settings.log_format)
    worker = settings.worker
    if worker.processes > 1 and child_index is None:
        from ._supervisor import Supervisor

        port, last = worker.metrics_port, (worker.metrics_port or 0) + worker.processes - 1
        if port and last > 65535:  # the supervisor's check: a child's own port is port + k
            raise click.UsageError(
                f"metrics port {port} with {worker.processes} processes: process k serves "
                f"port {port} + k, up to {last}, past 65535; give a lower port"
            )

        given = {
            name: value
            for name, value in ctx.params.items()
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
        }
        supervisor = Supervisor(given, worker.processes, worker.metrics_port, burst=worker.burst)
        ctx.exit(supervisor.run())
    from ._runtime import Worker

    # The app and its imports are loaded: move them out of the collector's way, and collect
    # less often, since the per-job objects are short-lived and free of cycles.
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    try:
        code = Worker(app, settings, child_index=child_index).run()
    except ConfigurationError as exc:  # the metrics port cannot be served, say
        click.echo(f"Error: {exc}", err=True)
        ctx.exit(exc.exit_code)
    ctx.exit(code)


def _settings(
    app: Pipeline,
    bootstrap_servers: str | None,
    namespace: str | None,
    options: dict[str, Any],
) -> Settings:
    """The application's settings with the command line's options on top, validated; an
    invalid one names its option."""
    base = app.settings
    given = {k: options[k] for k in WORKER_OPTIONS if options.get(k) is not None}
    worker = {**base.worker.model_dump(), **given}
    top: dict[str, Any] = {}
    if bootstrap_servers is not None:
        top["bootstrap_servers"] = bootstrap_servers
    if namespace is not None:
        top["namespace"] = namespace
    spelled = {param.name: param.opts[0] for param in command.params if param.opts}
    try:
        worker_settings = WorkerSettings.model_validate(worker)
    except ValidationError as exc:
        flags = {f"worker.{name}": spelled[name] for name in given}
        raise click.UsageError(str(settings_error(exc, ("worker",), flags))) from None
    try:
        if not top:
            return base.model_copy(update={"worker": worker_settings})
        merged = {**base.model_dump(), **top, "worker": worker_settings}
        return type(base).model_validate(merged)
    except ValidationError as exc:
        flags = {name: spelled[name] for name in top}
        raise click.UsageError(str(settings_error(exc, options=flags))) from None
