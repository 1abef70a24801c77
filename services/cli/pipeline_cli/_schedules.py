"""``pipeline schedules add|ls|rm``: cron schedules on the compacted ``<ns>.schedules`` topic."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from pipeline import Priority
from pipeline._errors import ConfigurationError
from pipeline._job import now_ms
from pipeline._records import MissedFires
from pipeline._schedule import (
    delete_schedule,
    make_schedule,
    next_fire_ms,
    payload_text,
    publish_schedules,
    read_schedules,
)

from ._output import (
    cli_errors,
    common_options,
    json_object,
    json_option,
    print_json,
    print_table,
)

if TYPE_CHECKING:
    from pipeline import Settings


@click.group()
def schedules() -> None:
    """Cron schedules: pipeline-scheduler enqueues a job at every fire."""


@schedules.command("add")
@click.argument("name")
@click.option("--cron", "cron", required=True, help="Cron expression, e.g. '*/5 * * * *'.")
@click.option("--type", "job_type", required=True, help="Job type each fire enqueues.")
@click.option(
    "--payload", default="{}", show_default=True, callback=json_object, help="JSON object."
)
@click.option("--tz", default="UTC", show_default=True, help="IANA time zone of the expression.")
@click.option(
    "--missed",
    type=click.Choice([m.value for m in MissedFires]),
    default="skip",
    show_default=True,
    help="Fires missed while no scheduler ran: none, one, or all of them.",
)
@click.option(
    "--priority",
    type=click.Choice([p.value for p in Priority]),
    default="default",
    show_default=True,
)
@click.option("--max-attempts", type=click.IntRange(min=1), default=None)
@common_options
def add(
    name: str,
    cron: str,
    job_type: str,
    payload: dict[str, Any],
    tz: str,
    missed: str,
    priority: str,
    max_attempts: int | None,
    settings: Settings,
) -> None:
    """Add or replace schedule NAME.

    \b
    Example:
      pipeline schedules add nightly-report --cron '0 3 * * *' --type report.build \\
          --payload '{"kind": "daily"}' --tz Europe/Paris --missed once
    """
    with cli_errors():
        schedule = make_schedule(
            name,
            cron=cron,
            job_type=job_type,
            payload=payload,
            tz=tz,
            missed=missed,
            priority=priority,
            max_attempts=max_attempts,
        )
        written = publish_schedules(settings, [schedule])
        first = next_fire_ms(cron, tz, now_ms())
    state = "saved" if written else "unchanged"
    click.echo(f"schedule {name} {state}; next fire {_when(first, tz)}")


@schedules.command("ls")
@json_option
@common_options
def ls(as_json: bool, settings: Settings) -> None:
    """List the schedules with their next fire times."""
    with cli_errors():
        table = read_schedules(settings)
    now = now_ms()
    rows = []
    for name in sorted(table):
        s = table[name]
        try:
            upcoming: int | None = next_fire_ms(s.cron, s.timezone, now) if s.enabled else None
        except ConfigurationError:
            upcoming = None
        rows.append((s, upcoming))
    if as_json:
        print_json(
            [
                {
                    "name": s.name,
                    "cron": s.cron,
                    "timezone": s.timezone,
                    "job_type": s.job_type,
                    "payload": payload_text(s),
                    "priority": s.priority.value,
                    "missed": s.missed,
                    "max_attempts": s.max_attempts,
                    "enabled": s.enabled,
                    "next_fire": _when(nxt, s.timezone) if nxt is not None else None,
                    "next_fire_ms": nxt,
                }
                for s, nxt in rows
            ]
        )
        return
    if not rows:
        click.echo("no schedules")
        return
    print_table(
        [
            (
                s.name,
                s.cron,
                s.timezone,
                s.job_type,
                s.missed,
                _when(nxt, s.timezone) if nxt else None,
            )
            for s, nxt in rows
        ],
        ["name", "cron", "tz", "type", "missed", "next fire"],
    )


@schedules.command("rm")
@click.argument("name")
@common_options
def rm(name: str, settings: Settings) -> None:
    """Remove schedule NAME (a tombstone on the topic)."""
    with cli_errors():
        if not delete_schedule(settings, name):
            raise click.ClickException(
                f"no schedule named {name!r}; `pipeline schedules ls` lists them"
            )
    click.echo(f"schedule {name} removed")


def _when(epoch_ms: int, tz: str) -> str:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    try:
        from zoneinfo import ZoneInfo

        moment = moment.astimezone(ZoneInfo(tz))
    except (ValueError, KeyError):
        pass
    return moment.isoformat(timespec="seconds")
