"""``pipeline jobs show ID`` and ``pipeline events tail``: a job's history and the live events.

The reading is :mod:`pipeline._eventlog`; both need the workers' ``events`` setting
(``errors`` shows failures only, ``all`` every step; see docs/operations.md).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import click

from pipeline._cliargs import not_empty
from pipeline._eventlog import EventFilter, follow_events, job_history
from pipeline._human import event_detail, when
from pipeline._records import EventKind

from ._dlqrender import letter_json, plural, shown
from ._output import (
    INTERVAL_MAX_S,
    Seconds,
    cli_errors,
    common_options,
    json_option,
    print_json,
    print_table,
    timeout_option,
)

if TYPE_CHECKING:
    from pipeline import Settings
    from pipeline._records import Event

EVENT_COLUMNS = ["at", "event", "job id", "type", "attempt", "priority", "worker", "detail"]
_TAIL_WIDTHS = (20, 12, 32, 20, 7, 8, 16)
"""Fixed widths for ``events tail``, which prints each event as it comes (longer values push
the rest of their line right)."""


def _tail_line(cells: list[object]) -> str:
    texts = ["-" if value is None else str(value) for value in cells]
    padded = [text.ljust(width) for text, width in zip(texts, _TAIL_WIDTHS, strict=False)]
    return "  ".join([*padded, *texts[len(_TAIL_WIDTHS) :]]).rstrip()


def _event_json(event: Event) -> dict[str, Any]:
    return {**dataclasses.asdict(event), "at_iso": when(event.at)}


def _event_row(event: Event) -> list[object]:
    """An event's cells for the terminal, each :func:`shown` (a handler writes the detail, a
    producer the job type)."""
    cells: list[object] = [
        when(event.at),
        event.kind,
        event.job_id,
        event.job_type,
        event.attempt,
        event.priority,
        event.worker,
        event_detail(event),
    ]
    return [shown(cell) for cell in cells]


@click.group()
def jobs() -> None:
    """Look a job up by id: what happened to it and where it is now."""


@jobs.command()
@click.argument("job_id", metavar="ID", callback=not_empty)
@timeout_option
@json_option
@common_options
def show(job_id: str, timeout: float, as_json: bool, settings: Settings) -> None:
    """The history of job ID from NAMESPACE.events, and its dead letters from NAMESPACE.dlq.

    Both topics are read whole (the events topic within its retention): the cost grows with
    their size. With the default events level (errors) only failures appear; set
    PIPELINE_EVENTS=all on the workers to see started, progress and succeeded too.
    Exits 1 when nothing is known about the job.
    """
    with cli_errors():
        history = job_history(settings, job_id, timeout=timeout)
    if history.unreadable:
        click.echo(
            f"warning: left out {plural(history.unreadable, 'record')} of job {job_id} on "
            f"{settings.namespace}.events that could not be decoded as events (written by a "
            "newer version of the workers? `pipeline --log-level INFO jobs ...` says why)",
            err=True,
        )
    if not history.found and not as_json:
        raise _not_found(job_id, history.scanned, settings)
    if as_json:
        print_json(
            {
                "job_id": job_id,
                "state": history.state,
                "events": [_event_json(e) for e in history.events],
                "dead_letters": [letter_json(s) for s in history.letters],
                "scanned_events": history.scanned,
                "unreadable_events": history.unreadable,
            }
        )
    else:
        click.echo(str(shown(f"job {job_id}: {history.state}")))
        if history.events:
            click.echo()
            print_table(
                [[r for i, r in enumerate(_event_row(e)) if i != 2] for e in history.events],
                [c for c in EVENT_COLUMNS if c != "job id"],
            )
        for stored in history.letters:
            letter = stored.letter
            line = (
                f"dead letter {letter.id} ({stored.status.value}): {letter.reason}, "
                f"{letter.error_class or ''}: {letter.message} at {when(letter.dead_at)}; "
                f"`pipeline dlq show {letter.id}` for more"
            )
            click.echo(f"\n{shown(line)}")
    if not history.found:
        raise _not_found(job_id, history.scanned, settings)


def _not_found(job_id: str, scanned: int, settings: Settings) -> click.ClickException:
    return click.ClickException(
        f"nothing known about job {job_id}: no event among the {scanned} on "
        f"{settings.namespace}.events and no dead letter. It may not have started yet, its "
        "events may be past retention, or the workers run with events=off (or errors, and "
        "it never failed)"
    )


@click.group()
def events() -> None:
    """The job lifecycle events on NAMESPACE.events."""


@events.command()
@click.option(
    "--type",
    "types",
    multiple=True,
    metavar="TYPE",
    callback=not_empty,
    help="Job type; shell wildcards match too (email.*). Repeatable.",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    type=click.Choice([k.value for k in EventKind]),
    help="Event kind. Repeatable.",
)
@click.option(
    "--job", "job_ids", multiple=True, metavar="ID", callback=not_empty, help="Job id. Repeatable."
)
@click.option(
    "--from-beginning", is_flag=True, help="Start at the oldest retained event, not at the end."
)
@click.option(
    "--max", "max_events", type=click.IntRange(min=1), default=None, help="Stop after N events."
)
@click.option(
    "--until-idle",
    type=Seconds(min=0.1, max=INTERVAL_MAX_S),
    default=None,
    metavar="SECONDS",
    help="Stop once no event has arrived for SECONDS.",
)
@timeout_option
@json_option
@common_options
def tail(
    types: tuple[str, ...],
    kinds: tuple[str, ...],
    job_ids: tuple[str, ...],
    from_beginning: bool,
    max_events: int | None,
    until_idle: float | None,
    timeout: float,
    as_json: bool,
    settings: Settings,
) -> None:
    """Follow the events, filtered, until Ctrl-C (or --max, --until-idle).

    With --json, one JSON object per line.

    \b
    Examples:
      pipeline events tail --type 'email.*' --kind dead --kind retried
      pipeline events tail --job 0194... --from-beginning --until-idle 2
    """
    event_filter = EventFilter(types=types, kinds=kinds, job_ids=job_ids)
    count = 0
    width_header = False
    try:
        with cli_errors():
            for event in follow_events(
                settings,
                event_filter,
                from_beginning=from_beginning,
                until_idle=until_idle,
                timeout=timeout,
            ):
                if as_json:
                    click.echo(json.dumps(_event_json(event), separators=(",", ":")))
                else:
                    if not width_header:
                        click.echo(_tail_line([c.upper() for c in EVENT_COLUMNS]))
                        width_header = True
                    click.echo(_tail_line(_event_row(event)))
                count += 1
                if max_events is not None and count >= max_events:
                    return
    except KeyboardInterrupt:
        return
