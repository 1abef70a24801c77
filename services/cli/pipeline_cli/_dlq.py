"""``pipeline dlq ls|show|replay|discard|stats``: the dead letters of ``<ns>.dlq``.

The logic is :mod:`pipeline._deadletters`; the options are in :mod:`._dlqoptions` and what
is printed in :mod:`._dlqrender`; this module holds the commands.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

import click

from pipeline import Priority
from pipeline._cliargs import not_empty
from pipeline._deadletters import (
    LetterFilter,
    LetterStatus,
    StoredLetter,
    WriteReport,
    actionable,
    discard_letters,
    dlq_stats,
    leave_empty,
    letter_order,
    nothing_to_replay,
    read_dead_letters,
    replay_letters,
    replay_targets,
)
from pipeline._errors import PipelineError, TopicMissingError
from pipeline._topiccheck import topic_name_problem
from pipeline._topics import TopicNames
from pipeline._topicspec import scheduler_control_topic

from ._dlqoptions import filter_options, yes_option
from ._dlqrender import (
    COLUMNS,
    letter_json,
    listing_summary,
    plural,
    print_stats,
    print_write,
    row,
    show_lines,
    skipped_text,
    targets_text,
    warn_undecodable,
)
from ._output import (
    cli_errors,
    common_options,
    json_option,
    print_json,
    print_table,
    timeout_option,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from pipeline import Settings
    from pipeline._deadletters import DeadLetterSnapshot

T = TypeVar("T")

_PROGRESS_FROM = 5
"""A replay or discard of more letters than this shows a progress bar."""


@click.group()
def dlq() -> None:
    """Dead letters: jobs that failed for good, and messages no worker could decode.

    ls and show inspect NAMESPACE.dlq; replay sends dead letters back to be run again; discard
    marks them handled. What was replayed or discarded is recorded on NAMESPACE.dlq-state, so
    every operator sees the same view. The filters (--type, --reason, --error, --since,
    --until, --tenant, --id) are shared by ls, replay and discard. See docs/dead-letters.md.
    """


def _read(
    settings: Settings, timeout: float, filters: LetterFilter | None = None
) -> DeadLetterSnapshot:
    """The dead letters, or only those ``filters`` match (the others are not kept as they
    are read)."""
    only = filters.matches if filters is not None else None
    with cli_errors():
        snapshot = read_dead_letters(settings, timeout=timeout, only=only)
    warn_undecodable(snapshot)
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
@timeout_option
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
    matching = _read(settings, timeout, filters).letters
    shown = [s for s in matching if show_all or s.status is LetterStatus.PENDING]
    listed = shown[:limit] if limit is not None else shown
    if as_json:
        print_json([letter_json(s) for s in listed])
        return
    if listed:
        print_table([row(s) for s in listed], COLUMNS)
    click.echo(listing_summary(matching, len(shown), len(listed), show_all), err=True)


@dlq.command()
@click.argument("ident", metavar="ID", callback=not_empty)
@timeout_option
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
    for line in show_lines(stored):
        click.echo(line)


def _run_write(
    what: str,
    todo: Sequence[StoredLetter],
    as_json: bool,
    write: Callable[[Callable[[int], None] | None], WriteReport],
    to_topic: str | None = None,
) -> WriteReport:
    if as_json or len(todo) <= _PROGRESS_FROM:
        with cli_errors(), _nothing_written(to_topic):
            return write(None)
    with (
        click.progressbar(length=len(todo), label=what, file=sys.stderr) as bar,
        cli_errors(),
        _nothing_written(to_topic),
    ):
        return write(bar.update)


def _check_target(to_topic: str | None, namespace: str) -> None:
    """Refuse a ``--to-topic`` that Kafka would refuse as a name, and one of the namespace that
    no worker reads jobs from: the jobs would be lost there, and their dead letters marked
    replayed."""
    if to_topic is None:
        return
    problem = topic_name_problem(to_topic)
    if problem is not None:
        raise click.BadParameter(
            f"{to_topic!r} is not a topic name: {problem}", param_hint="'--to-topic'"
        )
    from pipeline.outbox._progress import progress_topic  # imported when it is needed

    names = TopicNames(namespace)
    no_jobs = {
        names.dlq,
        names.dlq_state,
        names.dedup,
        names.schedules,
        names.scheduler_state,
        scheduler_control_topic(namespace),
        names.events,
        names.workers,
    }
    if to_topic in no_jobs or to_topic.startswith(progress_topic(namespace, "")):
        raise click.BadParameter(
            f"{to_topic} holds no jobs: no worker would run them there, and their dead "
            f"letters would be marked replayed; give a jobs topic such as {names.jobs('default')}",
            param_hint="'--to-topic'",
        )


@contextmanager
def _nothing_written(to_topic: str | None) -> Iterator[None]:
    """Say that a missing topic stopped the command before it wrote anything, and when it is
    the ``--to-topic`` one, say so rather than advise ``pipeline topics apply``."""
    try:
        yield
    except TopicMissingError as exc:
        if to_topic is not None and to_topic in exc.topics:
            raise PipelineError(
                f"topic {to_topic} (--to-topic) does not exist; nothing was written. "
                "Check its name, or create it first"
            ) from exc
        raise PipelineError(f"{exc}; nothing was written") from exc


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
    help="Send the jobs at this priority instead of their own: to its topic (unless "
    "--to-topic), and their retries after it.",
)
@click.option(
    "--to-topic",
    metavar="TOPIC",
    default=None,
    callback=not_empty,
    help="Send everything to TOPIC instead of NAMESPACE.jobs.<priority> "
    "(or, for an undecodable message, the topic it came from).",
)
@click.option(
    "--force", is_flag=True, help="Also replay dead letters already replayed or discarded."
)
@yes_option
@timeout_option
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
    _check_target(to_topic, settings.namespace)
    todo, skipped = actionable(_read(settings, timeout, filters).letters, force=force)
    todo, left = leave_empty(todo, skipped)
    with cli_errors():
        targets = replay_targets(
            todo,
            settings.namespace,
            reset_attempts=reset_attempts,
            priority=priority,
            to_topic=to_topic,
        )
    if dry_run:
        if as_json:
            # A letter with nothing to send is listed too, going nowhere; oldest first.
            going = dict(zip((s.letter.id for s in todo), targets, strict=True))
            listed = sorted([*todo, *left], key=letter_order)
            print_json([{**letter_json(s), "replay_to": going.get(s.letter.id)} for s in listed])
            return
        if todo:
            print_table([row(s) for s in todo], COLUMNS)
        where = f" to {targets_text(targets)}" if todo else ""
        click.echo(
            f"would replay {plural(len(todo))}{where}{skipped_text(skipped, len(left))}; dry run, "
            "nothing was changed",
            err=True,
        )
        return
    if not todo:
        print_write(as_json, "replay", WriteReport([], skipped, left))
        return
    kept = f" ({nothing_to_replay(len(left))})" if left else ""
    _confirm(f"Replay {plural(len(todo))} to {targets_text(targets)}{kept}?", yes)
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
        to_topic,
    )
    report.skipped.update(skipped)
    report.empty[:0] = left
    print_write(as_json, "replay", report)


@dlq.command()
@filter_options
@click.option(
    "--all-letters",
    is_flag=True,
    help="Allow running without any filter: discard every pending dead letter.",
)
@click.option("--dry-run", is_flag=True, help="Print what would be discarded; change nothing.")
@yes_option
@timeout_option
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
    todo, skipped = actionable(_read(settings, timeout, filters).letters)
    if dry_run:
        if as_json:
            print_json([letter_json(s) for s in todo])
            return
        if todo:
            print_table([row(s) for s in todo], COLUMNS)
        click.echo(
            f"would discard {plural(len(todo))}{skipped_text(skipped)}; dry run, "
            "nothing was changed",
            err=True,
        )
        return
    if not todo:
        print_write(as_json, "discard", WriteReport([], skipped))
        return
    _confirm(f"Discard {plural(len(todo))}?", yes)
    report = _run_write(
        "discarding",
        todo,
        as_json,
        lambda progress: discard_letters(settings, todo, timeout=timeout, on_progress=progress),
    )
    report.skipped.update(skipped)
    print_write(as_json, "discard", report)


@dlq.command()
@timeout_option
@json_option
@common_options
def stats(timeout: float, as_json: bool, settings: Settings) -> None:
    """Dead letters by status, and pending ones by reason and job type.

    The pending count is the DLQ depth to watch and alert on.
    """
    snapshot = _read(settings, timeout)
    print_stats(dlq_stats(snapshot), as_json)
