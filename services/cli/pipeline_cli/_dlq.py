"""``pipeline dlq ls|show|replay|discard|stats``: the dead letters of ``<ns>.dlq``.

The logic is :mod:`pipeline._deadletters`; this module parses options and prints.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import sys
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pipeline import Priority
from pipeline._deadletters import (
    LetterFilter,
    LetterStatus,
    StoredLetter,
    WriteReport,
    actionable,
    discard_letters,
    dlq_stats,
    parse_when,
    read_dead_letters,
    replay_letters,
    replay_message,
)
from pipeline._job import Job, PayloadEncoding

from ._output import cli_errors, common_options, json_option, print_json, print_table

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from pipeline import Settings
    from pipeline._deadletters import DeadLetterSnapshot, LetterState

T = TypeVar("T")

_PROGRESS_FROM = 5
"""A replay or discard of more letters than this shows a progress bar."""
_ERROR_WIDTH = 48
_PREVIEW_BYTES = 256


@click.group()
def dlq() -> None:
    """Dead letters: jobs that failed for good, and messages no worker could decode.

    ls and show inspect NAMESPACE.dlq; replay sends dead letters back to be run again; discard
    marks them handled. What was replayed or discarded is recorded on NAMESPACE.dlq-state, so
    every operator sees the same view. The filters (--type, --reason, --error, --since,
    --until, --tenant, --id) are shared by ls, replay and discard. See docs/dead-letters.md.
    """


# --- options --------------------------------------------------------------------------------


def _moment(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_when(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def filter_options(command: Callable[..., T]) -> Callable[..., T]:
    """Add the dead-letter filters; the command receives them as ``filters=LetterFilter``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        types: tuple[str, ...],
        reasons: tuple[str, ...],
        error_text: str | None,
        since: int | None,
        until: int | None,
        tenants: tuple[str, ...],
        ids: tuple[str, ...],
        **kwargs: Any,
    ) -> T:
        if since is not None and until is not None and since >= until:
            raise click.BadParameter("--since must be before --until", param_hint="'--since'")
        filters = LetterFilter(
            types=types,
            reasons=reasons,
            error=error_text,
            since=since,
            until=until,
            tenants=tenants,
            ids=ids,
        )
        return command(*args, filters=filters, **kwargs)

    options = [
        click.option(
            "--type",
            "types",
            multiple=True,
            metavar="TYPE",
            help="Job type; shell wildcards match too (email.*). Repeatable.",
        ),
        click.option(
            "--reason",
            "reasons",
            multiple=True,
            help="Why it was dead-lettered: max_attempts, fatal_error, timeout, decode_error, "
            "unknown_type, validation_error, poison_pill. Repeatable.",
        ),
        click.option(
            "--error",
            "error_text",
            metavar="TEXT",
            default=None,
            help="Text in the error class or message of the dead letter or any of its "
            "attempts (case-insensitive).",
        ),
        click.option(
            "--since",
            metavar="WHEN",
            callback=_moment,
            help="Dead-lettered at or after WHEN: an ISO-8601 datetime (UTC unless it has an "
            "offset) or a duration ago: 30m, 2h, 7d.",
        ),
        click.option(
            "--until",
            metavar="WHEN",
            callback=_moment,
            help="Dead-lettered before WHEN (same forms as --since).",
        ),
        click.option("--tenant", "tenants", multiple=True, help="Tenant. Repeatable."),
        click.option(
            "--id", "ids", multiple=True, metavar="ID", help="Dead-letter id or job id. Repeatable."
        ),
    ]
    decorated: Callable[..., T] = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def _timeout_option(command: Callable[..., T]) -> Callable[..., T]:
    return click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=30.0,
        show_default=True,
        help="Seconds Kafka may take to answer before the command fails as unreachable.",
    )(command)


def _yes_option(command: Callable[..., T]) -> Callable[..., T]:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(command)


# --- formatting -----------------------------------------------------------------------------


def _when(epoch_ms: int | None) -> str | None:
    if epoch_ms is None:
        return None
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _plural(count: int, noun: str = "dead letter") -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _payload(job: Job) -> tuple[Any, str]:
    """The payload for JSON output: the decoded value and ``json``, or base64 and ``base64``."""
    if job.payload_encoding is PayloadEncoding.JSON:
        try:
            return json.loads(job.payload), "json"
        except ValueError:
            pass
    return _b64(job.payload), "base64"


def _job_json(job: Job) -> dict[str, Any]:
    payload, payload_format = _payload(job)
    return {
        "id": job.id,
        "type": job.type,
        "payload": payload,
        "payload_format": payload_format,
        "payload_encoding": job.payload_encoding.value,
        "priority": job.priority.value,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "created_at": job.created_at,
        "not_before": job.not_before,
        "idempotency_key": job.idempotency_key,
        "tenant": job.tenant,
        "headers": job.headers,
        "errors": [dataclasses.asdict(error) for error in job.errors],
    }


def _state_json(state: LetterState | None) -> dict[str, Any] | None:
    if state is None:
        return None
    return {
        "status": state.status.value,
        "at": state.at,
        "at_iso": _when(state.at),
        "by": state.by,
        "to": state.to,
        "job_id": state.job_id,
    }


def letter_json(stored: StoredLetter) -> dict[str, Any]:
    """Every field of a dead letter, JSON-ready (bytes as base64)."""
    letter = stored.letter
    return {
        "id": letter.id,
        "job_id": letter.job_id,
        "job_type": letter.job_type,
        "status": stored.status.value,
        "state": _state_json(stored.state),
        "reason": letter.reason,
        "error_class": letter.error_class,
        "message": letter.message,
        "dead_at": letter.dead_at,
        "dead_at_iso": _when(letter.dead_at),
        "tenant": letter.tenant,
        "source_topic": letter.source_topic,
        "source_partition": letter.source_partition,
        "source_offset": letter.source_offset,
        "dlq_partition": stored.partition,
        "dlq_offset": stored.offset,
        "job": None if letter.job is None else _job_json(letter.job),
        "raw_value": _b64(letter.raw_value),
        "raw_key": _b64(letter.raw_key),
        "raw_headers": {name: _b64(value) for name, value in letter.raw_headers.items()},
        "traceback": letter.traceback,
    }


def _error_cell(stored: StoredLetter) -> str:
    letter = stored.letter
    short = (letter.error_class or "").rpartition(".")[2]
    text = f"{short}: {letter.message}" if short else letter.message
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_WIDTH else text[: _ERROR_WIDTH - 1] + "…"


def _source(stored: StoredLetter) -> str:
    letter = stored.letter
    return f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}"


_COLUMNS = ["id", "job id", "type", "reason", "error", "attempts", "dead at", "source", "status"]


def _row(stored: StoredLetter) -> list[object]:
    letter, job = stored.letter, stored.letter.job
    return [
        letter.id,
        letter.job_id,
        letter.job_type,
        letter.reason,
        _error_cell(stored),
        None if job is None else f"{job.attempt}/{job.max_attempts}",
        _when(letter.dead_at),
        _source(stored),
        stored.status.value,
    ]


def _warn_undecodable(snapshot: DeadLetterSnapshot) -> None:
    if snapshot.undecodable:
        click.echo(
            f"warning: left out {_plural(snapshot.undecodable, 'record')} of {snapshot.topic} "
            "that could not be decoded as dead letters (--log-level INFO says where)",
            err=True,
        )


def _skipped_text(skipped: Counter[LetterStatus]) -> str:
    parts = []
    if skipped[LetterStatus.REPLAYED]:
        parts.append(f"{skipped[LetterStatus.REPLAYED]} already replayed")
    if skipped[LetterStatus.DISCARDED]:
        parts.append(f"{skipped[LetterStatus.DISCARDED]} discarded")
    return f" ({', '.join(parts)}, skipped)" if parts else ""


def _targets_text(topics: Iterable[str | None]) -> str:
    counts = Counter(t for t in topics if t is not None)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{topic} ({count})" for topic, count in sorted(counts.items()))


def _read(settings: Settings, timeout: float) -> DeadLetterSnapshot:
    with cli_errors():
        snapshot = read_dead_letters(settings, timeout=timeout)
    _warn_undecodable(snapshot)
    return snapshot


# --- commands -------------------------------------------------------------------------------


@dlq.command("ls")
@filter_options
@click.option(
    "--all", "show_all", is_flag=True, help="Also list dead letters replayed or discarded."
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="List at most N (the oldest)."
)
@_timeout_option
@json_option
@common_options
def ls(
    filters: LetterFilter,
    show_all: bool,
    limit: int | None,
    timeout: float,
    as_json: bool,
    settings: Settings,
) -> None:
    """List dead letters, oldest first (pending ones unless --all).

    \b
    Examples:
      pipeline dlq ls --type 'email.*' --since 2h
      pipeline dlq ls --error timeout --json
    """
    snapshot = _read(settings, timeout)
    matching = snapshot.select(filters)
    shown = [s for s in matching if show_all or s.status is LetterStatus.PENDING]
    listed = shown[:limit] if limit is not None else shown
    if as_json:
        print_json([letter_json(s) for s in listed])
        return
    if listed:
        print_table([_row(s) for s in listed], _COLUMNS)
    counts = Counter(s.status for s in matching)
    replayed, discarded = counts[LetterStatus.REPLAYED], counts[LetterStatus.DISCARDED]
    head = _plural(len(shown))
    if len(listed) < len(shown):
        head = f"showing {len(listed)} of {head}"
    if show_all:
        tail = f"{counts[LetterStatus.PENDING]} pending, {replayed} replayed, {discarded} discarded"
    else:
        tail = f"{replayed} replayed, {discarded} discarded hidden"
    click.echo(f"{head} ({tail})", err=True)


@dlq.command()
@click.argument("ident", metavar="ID")
@_timeout_option
@json_option
@common_options
def show(ident: str, timeout: float, as_json: bool, settings: Settings) -> None:
    """Everything about one dead letter: ID is its id, or a job id that has one dead letter."""
    snapshot = _read(settings, timeout)
    with cli_errors():
        stored = snapshot.find(ident)
    if as_json:
        print_json(letter_json(stored))
        return
    for line in _show_lines(stored):
        click.echo(line)


def _show_lines(stored: StoredLetter) -> list[str]:
    letter, job, state = stored.letter, stored.letter.job, stored.state
    status = stored.status.value
    if state is not None:
        status += f" at {_when(state.at)} by {state.by}" + (f" to {state.to}" if state.to else "")
    last = f"{letter.error_class}: {letter.message}" if letter.error_class else letter.message
    fields: list[tuple[str, object]] = [
        ("dead letter", letter.id),
        ("status", status),
        ("reason", letter.reason),
        ("error", last),
        ("dead at", _when(letter.dead_at)),
        ("source", _source(stored)),
        ("dlq position", f"[{stored.partition}]@{stored.offset}"),
        ("tenant", letter.tenant),
        ("key", _bytes_text(letter.raw_key)),
    ]
    if job is not None:
        fields += [
            ("job", job.id),
            ("type", job.type),
            ("priority", job.priority.value),
            ("attempt", f"{job.attempt} of {job.max_attempts}"),
            ("created at", _when(job.created_at)),
            ("not before", _when(job.not_before)),
            ("idempotency key", job.idempotency_key),
            ("headers", ", ".join(f"{k}={v}" for k, v in job.headers.items()) or None),
        ]
    width = max(len(name) for name, _ in fields)
    lines = [f"{name.ljust(width)}  {'-' if value is None else value}" for name, value in fields]
    if job is not None:
        payload, payload_format = _payload(job)
        lines.append(f"payload ({job.payload_encoding.value}, {len(job.payload)} bytes):")
        text = json.dumps(payload, indent=2) if payload_format == "json" else _hexdump(job.payload)
        lines += ["  " + line for line in text.splitlines()]
        lines.append(f"attempts ({len(job.errors)} failed):" if job.errors else "attempts: none")
        for error in job.errors:
            retry = "retryable" if error.retryable else "not retryable"
            extra = ", ".join(
                x
                for x in [retry, error.worker and f"worker {error.worker}", error.traceback_digest]
                if x
            )
            lines.append(f"  #{error.attempt}  {_when(error.at)}  {error.error_class} ({extra})")
            lines += ["      " + line for line in error.message.splitlines() or [""]]
    if letter.traceback:
        lines.append("traceback (last error):")
        lines += ["  " + line for line in letter.traceback.splitlines()]
    if letter.raw_value is not None:
        lines.append(f"raw value ({len(letter.raw_value)} bytes):")
        lines += ["  " + line for line in _hexdump(letter.raw_value).splitlines()]
        lines.append(f"  base64: {_b64(letter.raw_value[:_PREVIEW_BYTES])}")
    if letter.raw_headers:
        lines.append("raw headers:")
        lines += [f"  {k}: {_bytes_text(v)}" for k, v in letter.raw_headers.items()]
    return lines


def _bytes_text(data: bytes | None) -> str | None:
    """Printable UTF-8 as it is, anything else as hex."""
    if data is None:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"0x{data.hex()}"
    return text if text.isprintable() else f"0x{data.hex()}"


def _hexdump(data: bytes) -> str:
    lines = []
    for at in range(0, min(len(data), _PREVIEW_BYTES), 16):
        chunk = data[at : at + 16]
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{at:04x}  {chunk.hex(' '):<47}  {ascii_}")
    if len(data) > _PREVIEW_BYTES:
        lines.append(f"... {len(data) - _PREVIEW_BYTES} more bytes")
    return "\n".join(lines)


def _run_write(
    what: str,
    todo: Sequence[StoredLetter],
    as_json: bool,
    write: Callable[[Callable[[int], None] | None], WriteReport],
) -> WriteReport:
    if as_json or len(todo) <= _PROGRESS_FROM:
        with cli_errors():
            return write(None)
    with (
        click.progressbar(length=len(todo), label=what, file=sys.stderr) as bar,
        cli_errors(),
    ):
        return write(bar.update)


def _confirm(question: str, yes: bool) -> None:
    if not yes:
        click.confirm(question, abort=True, err=True)


@dlq.command()
@filter_options
@click.option(
    "--dry-run", is_flag=True, help="Print the dead letters that would be replayed; change nothing."
)
@click.option(
    "--reset-attempts",
    is_flag=True,
    help="Start the jobs again at attempt 1 (all their retries) instead of one more attempt.",
)
@click.option(
    "--priority",
    type=click.Choice([p.value for p in Priority]),
    default=None,
    help="Send the jobs at this priority instead of their own.",
)
@click.option(
    "--to-topic",
    metavar="TOPIC",
    default=None,
    help="Send everything to TOPIC instead of NAMESPACE.jobs.<priority> "
    "(or, for an undecodable message, the topic it came from).",
)
@click.option(
    "--force", is_flag=True, help="Also replay dead letters already replayed or discarded."
)
@_yes_option
@_timeout_option
@json_option
@common_options
def replay(
    filters: LetterFilter,
    dry_run: bool,
    reset_attempts: bool,
    priority: str | None,
    to_topic: str | None,
    force: bool,
    yes: bool,
    timeout: float,
    as_json: bool,
    settings: Settings,
) -> None:
    """Send matching dead letters back to be run again, and mark them replayed.

    A job keeps its id, payload, headers, key and error history; it gets one more attempt
    (so a new failure dead-letters it again) or, with --reset-attempts, all of them. A
    message that could not be decoded is sent back byte for byte. Each batch is one Kafka
    transaction with its state records, so a dead letter is replayed once even if this command
    dies midway; run it again to finish. Already replayed or discarded ones are skipped unless
    --force.

    \b
    Examples:
      pipeline dlq replay --type email.send --reason max_attempts --dry-run
      pipeline dlq replay --id 0194... --reset-attempts --priority high --yes
    """
    snapshot = _read(settings, timeout)
    todo, skipped = actionable(snapshot.select(filters), force=force)
    with cli_errors():
        targets = [
            replay_message(
                s.letter,
                settings.namespace,
                reset_attempts=reset_attempts,
                priority=priority,
                to_topic=to_topic,
            ).topic
            for s in todo
        ]
    if dry_run:
        if as_json:
            print_json(
                [{**letter_json(s), "replay_to": t} for s, t in zip(todo, targets, strict=True)]
            )
            return
        if todo:
            print_table([_row(s) for s in todo], _COLUMNS)
        where = f" to {_targets_text(targets)}" if todo else ""
        click.echo(
            f"would replay {_plural(len(todo))}{where}{_skipped_text(skipped)}; dry run, "
            "nothing was changed",
            err=True,
        )
        return
    if not todo:
        _print_write(as_json, "replay", WriteReport([], skipped))
        return
    _confirm(f"Replay {_plural(len(todo))} to {_targets_text(targets)}?", yes)
    report = _run_write(
        "replaying",
        todo,
        as_json,
        lambda progress: replay_letters(
            settings,
            todo,
            reset_attempts=reset_attempts,
            priority=priority,
            to_topic=to_topic,
            force=force,
            timeout=timeout,
            on_progress=progress,
        ),
    )
    report.skipped.update(skipped)
    _print_write(as_json, "replay", report)


def _print_write(as_json: bool, verb: str, report: WriteReport) -> None:
    if as_json:
        print_json(
            {
                f"{verb}ed": [
                    {
                        "id": s.letter.id,
                        "job_id": s.letter.job_id,
                        "to": s.state.to if s.state else None,
                    }
                    for s in report.done
                ],
                "skipped": {status.value: count for status, count in report.skipped.items()},
            }
        )
        return
    done = report.done
    where = f" to {_targets_text(s.state.to for s in done if s.state)}" if verb == "replay" else ""
    past = "replayed" if verb == "replay" else "discarded"
    if not done:
        click.echo(f"nothing to {verb}{_skipped_text(report.skipped)}")
        return
    click.echo(f"{past} {_plural(len(done))}{where}{_skipped_text(report.skipped)}")


@dlq.command()
@filter_options
@click.option(
    "--all-letters",
    is_flag=True,
    help="Allow running without any filter: discard every pending dead letter.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be discarded; change nothing.")
@_yes_option
@_timeout_option
@json_option
@common_options
def discard(
    filters: LetterFilter,
    all_letters: bool,
    dry_run: bool,
    yes: bool,
    timeout: float,
    as_json: bool,
    settings: Settings,
) -> None:
    """Mark matching pending dead letters discarded: they leave `ls` (still seen with --all).

    Nothing is deleted from NAMESPACE.dlq (its retention does that); the decision is recorded
    on NAMESPACE.dlq-state with a `discarded` event. A filter is required, or --all-letters.

    \b
    Example:
      pipeline dlq discard --type report.build --until 7d --yes
    """
    if filters.empty and not all_letters:
        raise click.UsageError(
            "give at least one filter (--type, --reason, --error, --since, --until, --tenant, "
            "--id), or --all-letters to discard every pending dead letter"
        )
    snapshot = _read(settings, timeout)
    todo, skipped = actionable(snapshot.select(filters))
    if dry_run:
        if as_json:
            print_json([letter_json(s) for s in todo])
            return
        if todo:
            print_table([_row(s) for s in todo], _COLUMNS)
        click.echo(
            f"would discard {_plural(len(todo))}{_skipped_text(skipped)}; dry run, "
            "nothing was changed",
            err=True,
        )
        return
    if not todo:
        _print_write(as_json, "discard", WriteReport([], skipped))
        return
    _confirm(f"Discard {_plural(len(todo))}?", yes)
    report = _run_write(
        "discarding",
        todo,
        as_json,
        lambda progress: discard_letters(settings, todo, timeout=timeout, on_progress=progress),
    )
    report.skipped.update(skipped)
    _print_write(as_json, "discard", report)


@dlq.command()
@_timeout_option
@json_option
@common_options
def stats(timeout: float, as_json: bool, settings: Settings) -> None:
    """Dead letters by status, and pending ones by reason and job type.

    The pending count is the DLQ depth to watch and alert on.
    """
    snapshot = _read(settings, timeout)
    counts = dlq_stats(snapshot)
    if as_json:
        print_json(
            {
                **counts.by_status,
                "depth": counts.depth,
                "pending_by_reason": counts.pending_by_reason,
                "pending_by_type": counts.pending_by_type,
                "undecodable": counts.undecodable,
            }
        )
        return
    by_status = counts.by_status
    click.echo(
        f"{by_status['pending']} pending ({by_status['replayed']} replayed, "
        f"{by_status['discarded']} discarded)"
    )
    for title, table in [("reason", counts.pending_by_reason), ("type", counts.pending_by_type)]:
        if table:
            click.echo()
            print_table(table.items(), [title, "pending"])
