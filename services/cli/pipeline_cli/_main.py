"""The root ``pipeline`` command group."""

from __future__ import annotations

import logging

import click

from pipeline._cliargs import Group
from pipeline._processend import run_then_end

from ._acls import acls
from ._dev import dev
from ._dlq import dlq
from ._enqueue import enqueue
from ._exporter import exporter
from ._jobs import events, jobs
from ._outbox import outbox
from ._schedules import schedules
from ._status import status
from ._topics import topics
from ._web import web


@click.group(
    cls=Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="kafka-pipeline", prog_name="pipeline")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="WARNING",
    show_default=True,
    help="Logging level of the command's own messages.",
)
def cli(log_level: str) -> None:
    """Background jobs on Apache Kafka: manage topics, enqueue jobs, inspect and replay dead
    letters, run a local broker.

    Settings come from PIPELINE_* environment variables (PIPELINE_BOOTSTRAP_SERVERS,
    PIPELINE_NAMESPACE, ...), a TOML file named by PIPELINE_CONFIG_FILE, or the options of
    each command.
    """
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")


cli.add_command(dev)
cli.add_command(topics)
cli.add_command(enqueue)
cli.add_command(schedules)
cli.add_command(dlq)
cli.add_command(status)
cli.add_command(jobs)
cli.add_command(events)
cli.add_command(exporter)
cli.add_command(web)
cli.add_command(acls)
cli.add_command(outbox)


def main() -> None:
    """The ``pipeline`` command; the process ends without the interpreter's finalization
    (see :mod:`pipeline._processend`)."""
    run_then_end(lambda: cli(prog_name="pipeline"))
