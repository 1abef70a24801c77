"""``pipeline schedules add|ls|rm|pause|resume|trigger``: cron schedules on ``<ns>.schedules``.

Pause, resume and trigger are :mod:`pipeline._scheduleops`, which other front ends call too.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from pipeline import Priority
from pipeline._cliargs import not_empty
from pipeline._deadletters import is_duration_ago
from pipeline._errors import (
    ConfigurationError,
    PayloadValidationError,
    UnknownJobTypeError,
)
from pipeline._job import now_ms
from pipeline._messagesize import message_max_bytes
from pipeline._records import MissedFires, Schedule
from pipeline._schedule import ScheduleRecord, make_schedule, next_fire_ms, payload_text
from pipeline._scheduleops import pause_schedule, resume_schedule, trigger_schedule
from pipeline._scheduletable import delete_schedule, read_schedule_records, save_schedules

from ._output import (
    ATTEMPTS_MAX,
    app_settings,
    cli_errors,
    common_options,
    json_object,
    json_option,
    load_app_option,
    moment,
    print_json,
    print_table,
    within_dates,
)

if TYPE_CHECKING:
    from pipeline import Settings


@click.group()
def schedules() -> None:
    """Cron schedules: pipeline-scheduler enqueues a job at every fire."""


@schedules.command("add")
@click.argument("name", callback=not_empty)
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
    default=None,
    help="Priority of every fire [default: the one the job type declares, else default].",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1, max=ATTEMPTS_MAX),
    default=None,
    help="Attempts of every fire [default: the job type's, else the setting].",
)
@click.option(
    "--app",
    "app_spec",
    metavar="MODULE[:ATTR]",
    help="Check against this application: the job type must be registered, the payload must "
    "suit its handler, and its payload codec encodes it.",
)
@common_options
def add(
    name: str,
    cron: str,
    job_type: str,
    payload: dict[str, Any],
    tz: str,
    missed: str,
    priority: str | None,
    max_attempts: int | None,
    app_spec: str | None,
    settings: Settings,
) -> None:
    """Add or replace schedule NAME.

    Nothing is written unless the expression fires within the next few years (a date such as
    February 30th never does) and the time zone exists.

    \b
    Example:
      pipeline schedules add nightly-report --cron '0 3 * * *' --type report.build \\
          --payload '{"kind": "daily"}' --tz Europe/Paris --missed once
    """
    options: dict[str, Any] = {
        "payload": payload,
        "tz": tz,
        "missed": missed,
        "priority": priority,
        "max_attempts": max_attempts,
    }
    try:
        if app_spec is not None:
            app = load_app_option(app_spec)
            assert app is not None  # a spec was given
            app.registry.get(job_type)  # the type must be known
            schedule = app.schedule(name, cron=cron, job_type=job_type, **options)
            settings = app_settings(app, settings)  # saved where the application's are
        else:
            limit = message_max_bytes(settings)
            schedule = make_schedule(name, cron=cron, job_type=job_type, max_bytes=limit, **options)
    except (ConfigurationError, PayloadValidationError, UnknownJobTypeError) as exc:
        raise click.UsageError(str(exc)) from exc
    with cli_errors():
        written, paused = save_schedules(settings, [schedule])
        first = next_fire_ms(cron, tz, now_ms())
    state = "saved" if written else "unchanged"
    if paused:
        click.echo(f"schedule {name} {state}; paused (`pipeline schedules resume {name}`)")
    else:
        click.echo(f"schedule {name} {state}; next fire {_when(first, tz)}")


@schedules.command("ls")
@json_option
@common_options
def ls(as_json: bool, settings: Settings) -> None:
    """List the schedules with their next fire times; paused and invalid ones as such."""
    with cli_errors():
        table = read_schedule_records(settings)
    now = now_ms()
    rows = [(table[name], _next_fire(table[name], now)) for name in sorted(table)]
    if as_json:
        print_json([_json_row(record, nxt) for record, nxt in rows])
        return
    if not rows:
        click.echo("no schedules")
        return
    print_table(
        [
            (
                record.name,
                s.cron if s else None,
                s.timezone if s else None,
                s.job_type if s else None,
                s.missed if s else None,
                f"INVALID: {record.problem}"
                if record.problem
                else (
                    "paused"
                    if s and not s.enabled
                    else _when(nxt, s.timezone)
                    if s and nxt
                    else None
                ),
            )
            for record, nxt in rows
            for s in [record.schedule]
        ],
        ["name", "cron", "tz", "type", "missed", "next fire"],
    )


def _next_fire(record: ScheduleRecord, now: int) -> int | None:
    s = record.schedule
    if record.problem is not None or s is None or not s.enabled:
        return None
    try:
        return next_fire_ms(s.cron, s.timezone, now)
    except ConfigurationError:
        return None


def _json_row(record: ScheduleRecord, nxt: int | None) -> dict[str, Any]:
    s: Schedule | None = record.schedule
    row: dict[str, Any] = {"name": record.name, "valid": record.problem is None}
    row["problem"] = record.problem
    if s is not None:
        row.update(
            cron=s.cron,
            timezone=s.timezone,
            job_type=s.job_type,
            payload=payload_text(s),
            priority=s.priority.value if s.priority is not None else None,
            missed=s.missed,
            max_attempts=s.max_attempts,
            enabled=s.enabled,
            paused=not s.enabled,
        )
    row["next_fire"] = _when(nxt, s.timezone) if s is not None and nxt is not None else None
    row["next_fire_ms"] = nxt
    return row


@schedules.command("rm")
@click.argument("name", callback=not_empty)
@common_options
def rm(name: str, settings: Settings) -> None:
    """Remove schedule NAME, valid or not (a tombstone on the topic)."""
    with cli_errors():
        if not delete_schedule(settings, name):
            raise click.ClickException(
                f"no schedule named {name!r}; `pipeline schedules ls` lists them"
            )
    click.echo(f"schedule {name} removed")


@schedules.command("pause")
@click.argument("name", callback=not_empty)
@json_option
@common_options
def pause(name: str, as_json: bool, settings: Settings) -> None:
    """Stop schedule NAME from firing until `pipeline schedules resume NAME`.

    Idempotent. `schedules add` and the schedules an application publishes keep it paused.
    """
    with cli_errors():
        changed = pause_schedule(settings, name)
    _said(name, "paused", changed, as_json)


@schedules.command("resume")
@click.argument("name", callback=not_empty)
@json_option
@common_options
def resume(name: str, as_json: bool, settings: Settings) -> None:
    """Let paused schedule NAME fire again, from now on.

    The fires whose time fell while it was paused never fire, whatever its --missed policy.
    """
    with cli_errors():
        changed = resume_schedule(settings, name)
    _said(name, "resumed", changed, as_json)


def _at(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    if value.strip().isascii() and value.strip().isdigit():  # "²" is a digit, not a number
        if len(value.strip()) > 20:  # past any epoch millisecond (and Python's int parsing)
            raise click.BadParameter(f"{value[:24]}... is out of range for epoch milliseconds")
        return within_dates(value, int(value))
    if is_duration_ago(value):
        # WHEN names the request: "1h" ago is another time at every run, so a repeated trigger
        # would run the job again instead of once.
        raise click.BadParameter(
            f"{value!r} is a duration ago, another time at each run: give the time itself "
            "(ISO-8601 or epoch milliseconds), so that repeating the trigger runs it once"
        )
    return moment(
        value,
        refused=f"{value!r} is neither an ISO-8601 datetime (e.g. 2025-01-31T12:00:00Z, "
        "2025-01-31) nor epoch milliseconds",
    )


@schedules.command("trigger")
@click.argument("name", callback=not_empty)
@click.option(
    "--at",
    "at_ms",
    metavar="WHEN",
    callback=_at,
    default=None,
    help="The time that names this request, in epoch milliseconds or ISO-8601 [default: now]: "
    "triggers with the same WHEN run the job once.",
)
@json_option
@common_options
def trigger(name: str, at_ms: int | None, as_json: bool, settings: Settings) -> None:
    """Enqueue one fire of schedule NAME now (paused or not) and print its job id.

    The job is the one a fire enqueues, with the header pipeline-trigger: manual and the
    idempotency key manual:NAME:WHEN, so repeating a trigger with the same --at runs it once.
    """
    with cli_errors():
        job = trigger_schedule(settings, name, at_ms=at_ms)
    if as_json:
        print_json(
            {
                "id": job.id,
                "schedule": name,
                "type": job.type,
                "priority": job.priority.value,
                "idempotency_key": job.idempotency_key,
            }
        )
    else:
        click.echo(job.id)


def _said(name: str, state: str, changed: bool, as_json: bool) -> None:
    if as_json:
        print_json({"name": name, "state": state, "changed": changed})
    else:
        click.echo(
            f"schedule {name} {state}" if changed else f"schedule {name} was {state} already"
        )


def _when(epoch_ms: int, tz: str) -> str:
    at = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    try:
        from zoneinfo import ZoneInfo

        at = at.astimezone(ZoneInfo(tz))
    except (ValueError, KeyError, OSError):
        pass
    return at.isoformat(timespec="seconds")
