"""The options of ``pipeline dlq`` commands: the dead-letter filters, ``--yes``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from pipeline._cliargs import not_empty
from pipeline._deadletters import LetterFilter
from pipeline._records import DeadLetterReason

from ._output import moment

T = TypeVar("T")


def _moment(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else moment(value)


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
            callback=not_empty,
            help="Job type; shell wildcards match too (email.*). Repeatable.",
        ),
        click.option(
            "--reason",
            "reasons",
            multiple=True,
            # A misspelt reason matched nothing: `replay --reason max_attempt` said "nothing
            # to replay" and exited 0.
            type=click.Choice([r.value for r in DeadLetterReason], case_sensitive=False),
            help="Why it was dead-lettered. Repeatable.",
        ),
        click.option(
            "--error",
            "error_text",
            metavar="TEXT",
            default=None,
            callback=not_empty,
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
        click.option(
            "--tenant", "tenants", multiple=True, callback=not_empty, help="Tenant. Repeatable."
        ),
        click.option(
            "--id",
            "ids",
            multiple=True,
            metavar="ID",
            callback=not_empty,
            help="Dead-letter id or job id. Repeatable.",
        ),
    ]
    decorated: Callable[..., T] = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def yes_option(command: Callable[..., T]) -> Callable[..., T]:
    return click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")(command)
