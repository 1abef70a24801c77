"""``pipeline status``: backlog, oldest waiting job, rates, workers, scheduler, dead letters.

The reading is :func:`pipeline._status.read_status` (on a :class:`pipeline._backlog.BacklogReader`
kept between refreshes); what is printed is in :mod:`._statusrender`.
"""

from __future__ import annotations

import contextlib
import json
import threading
from typing import TYPE_CHECKING

import click

from pipeline._backlog import BacklogReader
from pipeline._status import read_status

from ._output import (
    INTERVAL_MAX_S,
    Seconds,
    cli_errors,
    common_options,
    json_option,
    print_json,
    timeout_option,
)
from ._statusrender import print_status, status_json

if TYPE_CHECKING:
    from pipeline import Settings
    from pipeline._status import StatusSnapshot


@click.command()
@click.option(
    "--watch",
    "-w",
    "interval",
    type=Seconds(min=0.5, max=INTERVAL_MAX_S),
    default=None,
    is_flag=False,
    flag_value=2.0,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (default 2) until Ctrl-C; rates in and out are measured "
    "between refreshes.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="With --watch: stop after N refreshes.",
)
@timeout_option
@json_option
@common_options
def status(
    interval: float | None,
    count: int | None,
    timeout: float,
    as_json: bool,
    settings: Settings,
) -> None:
    """Backlog and oldest waiting job per priority, retry tiers and deferred jobs, the workers
    in the group, the scheduler leader, dead letters pending and cron schedules.

    Everything is read from Kafka: no worker or scheduler needs to run. The rates in and out
    need two readings, so a single run shows n/a; --watch measures them between refreshes.
    With --json and --watch, each refresh is one JSON document on one line.

    \b
    Examples:
      pipeline status
      pipeline status --watch 5
      pipeline status --json | jq '.priorities[] | {name, backlog, oldest_age_s}'
    """
    if count is not None and interval is None:
        raise click.UsageError("--count needs --watch")
    previous: StatusSnapshot | None = None
    shown = 0
    pause = threading.Event()
    with cli_errors():
        reader = BacklogReader(settings, timeout=timeout)
    with reader, contextlib.suppress(KeyboardInterrupt):
        while True:
            with cli_errors():
                snapshot = read_status(settings, timeout=timeout, reader=reader)
            if as_json and interval is not None:
                click.echo(json.dumps(status_json(snapshot, previous), separators=(",", ":")))
            elif as_json:
                print_json(status_json(snapshot, previous))
            else:
                if interval is not None:
                    click.clear()
                print_status(snapshot, previous)
            shown += 1
            if interval is None or (count is not None and shown >= count):
                return
            previous = snapshot
            pause.wait(interval)
