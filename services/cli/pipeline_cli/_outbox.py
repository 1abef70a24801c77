"""``pipeline outbox``: the transactional outbox's relay, its table and what waits in it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pipeline._errors import ConfigurationError, PipelineError
from pipeline._logfmt import configure_logging
from pipeline.outbox._progress import MAX_IDS

from ._output import (
    INTERVAL_MAX_S,
    Seconds,
    UsageFailure,
    cli_errors,
    common_options,
    json_option,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from pipeline import Settings

F = TypeVar("F", bound=Callable[..., Any])


def _database_options(command: F) -> F:
    command = click.option(
        "--table",
        default="pipeline_outbox",
        show_default=True,
        help="The outbox table (schema.table allowed).",
    )(command)
    return click.option(
        "--dsn",
        envvar="PIPELINE_OUTBOX_DSN",
        required=True,
        metavar="DSN",
        help="The service's database: postgresql://user@host:port/db or sqlite:///path.db "
        "[env: PIPELINE_OUTBOX_DSN, which keeps a password off the command line].",
    )(command)


@click.group()
def outbox() -> None:
    """Jobs written in the service's own database transactions, relayed to Kafka."""


@outbox.command()
@common_options
@_database_options
@click.option(
    "--batch-size",
    type=click.IntRange(min=1, max=MAX_IDS),
    default=5000,
    show_default=True,
    help="Rows per read, per Kafka transaction and per delete.",
)
@click.option(
    "--batch-max-bytes",
    type=click.IntRange(min=1),
    default=64 * 2**20,
    show_default=True,
    help="Bytes of rows per batch: what the relay holds in memory (a larger row goes alone).",
)
@click.option(
    "--poll-interval",
    type=Seconds(min=0.01, max=INTERVAL_MAX_S),
    default=0.1,
    show_default=True,
    help="Seconds between two reads of an empty table.",
)
def relay(
    settings: Settings,
    dsn: str,
    table: str,
    batch_size: int,
    batch_max_bytes: int,
    poll_interval: float,
) -> None:
    """Publish the outbox rows to Kafka in order; delete each once Kafka has it.

    One relay per table is active, the others are standbys that take over when it dies
    (a PostgreSQL advisory lock, a file lock beside a SQLite database). Runs until SIGTERM.
    """
    from pipeline.outbox import OutboxRelay, RelayOptions

    configure_logging("INFO", settings.log_format)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with cli_errors(), _usage_errors():
        options = RelayOptions(
            table=table,
            batch_size=batch_size,
            batch_max_bytes=batch_max_bytes,
            poll_interval_s=poll_interval,
        )
        OutboxRelay(settings, dsn, options).run(stop)


@outbox.command()
@_database_options
def init(dsn: str, table: str) -> None:
    """Create the outbox table if it does not exist (the relay does too when it starts)."""
    from pipeline.outbox import connect, create_table
    from pipeline.outbox._dialect import checked_table

    with cli_errors(), _usage_errors():
        checked_table(table)  # before the database: a SQLite one would be created
        connection, _ = connect(dsn)
        try:
            create_table(connection, table)
        except PipelineError:
            raise
        except Exception as exc:  # the driver's error: no permission, a bad schema
            raise click.ClickException(f"cannot create outbox table {table}: {exc}") from exc
        finally:
            connection.close()
    click.echo(f"outbox table {table} is ready")


@outbox.command()
@_database_options
@json_option
def status(dsn: str, table: str, as_json: bool) -> None:
    """How many rows wait to be relayed, and the age of the oldest."""
    from pipeline.outbox import outbox_status

    with cli_errors(), _usage_errors():
        try:
            found = outbox_status(dsn, table)
        except PipelineError:
            raise
        except Exception as exc:  # the driver's error: no such table, no database
            raise click.ClickException(f"cannot read outbox table {table}: {exc}") from exc
    if as_json:
        print_json(found.to_dict())
        return
    age = None if found.oldest_age_s is None else round(found.oldest_age_s, 1)
    print_table([[found.table, found.pending, age]], ["table", "pending", "oldest age (s)"])


@contextmanager
def _usage_errors() -> Iterator[None]:
    """A :class:`ConfigurationError` (bad DSN, bad table name, no driver): exit code 2."""
    try:
        yield
    except ConfigurationError as exc:
        raise UsageFailure(str(exc)) from exc
