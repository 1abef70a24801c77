"""Argument checks the command lines share (``pipeline``, ``pipeline-worker``,
``pipeline-scheduler``): a wrong argument is a click usage error, exit code 2, saying what is
wrong."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ._errors import ConfigurationError
from ._settings import check_config_file

__all__ = [
    "Command",
    "Group",
    "config_file_option",
    "not_empty",
    "service_config_file",
]

F = TypeVar("F", bound=Callable[..., Any])


def _utf8_only(args: list[str]) -> None:
    """Refuse an argument that is not valid UTF-8. Python hands such bytes over as lone
    surrogates (``\udcff``), which every later encoding refused with a traceback: of a
    schedule's name, a job id looked up, a payload, the brokers given to librdkafka."""
    for arg in args:
        try:
            arg.encode()
        except UnicodeEncodeError:
            shown = arg.encode(errors="surrogateescape").decode(errors="backslashreplace")
            raise click.UsageError(f"the argument '{shown}' is not valid UTF-8") from None


class Command(click.Command):
    """A command whose arguments must be valid UTF-8 (a usage error, exit code 2, if not)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        _utf8_only(args)
        return super().parse_args(ctx, args)


class Group(Command, click.Group):
    """A group whose arguments, its commands' included, must be valid UTF-8."""


def not_empty(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A click callback: a value given, but empty or blank, is a mistake. It would match
    everything (``--error ""``, the text found in every message), be taken as not given
    (``--group ""``, ``--to-topic ""``), or name nothing (``jobs show ""``)."""
    values = value if isinstance(value, tuple) else (value,)
    if any(v is not None and not v.strip() for v in values):
        raise click.BadParameter("must not be empty")
    return value


def config_file_option(command: F) -> F:
    """Add a service's ``--config FILE`` (passed as ``config_file``), which
    :func:`service_config_file` makes the process's config file."""
    return click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="TOML settings file (as PIPELINE_CONFIG_FILE).",
    )(command)


def service_config_file(path: Path | None) -> None:
    """Make ``--config PATH`` (when given) the config file of this process, as
    ``PIPELINE_CONFIG_FILE``, which the application's ``Pipeline()`` reads too; then a file that
    is missing or not TOML, named either way, is a usage error (exit code 2) before the
    application is imported (see :func:`pipeline._settings.check_config_file`)."""
    if path is not None:
        os.environ["PIPELINE_CONFIG_FILE"] = str(path.resolve())
    try:
        check_config_file()
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
