"""Helpers every ``pipeline`` command shares: settings options, tables, JSON and clean errors."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import date, datetime
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from pydantic import ValidationError

from pipeline._deadletters import EARLIEST_MS, LATEST_MS, parse_when
from pipeline._errors import (
    ConfigurationError,
    KafkaAuthenticationError,
    PayloadValidationError,
    PipelineError,
    UnknownJobTypeError,
)
from pipeline._invalidsettings import settings_error
from pipeline._settings import Settings, reading_config_file

if TYPE_CHECKING:
    from pipeline import Pipeline

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

__all__ = [
    "UsageFailure",
    "app_settings",
    "cli_errors",
    "common_options",
    "json_option",
    "load_app_option",
    "load_settings",
    "print_json",
    "print_table",
]


USAGE_ERRORS: tuple[type[PipelineError], ...] = (
    ConfigurationError,  # settings, options or arguments that cannot be used (SettingsError...)
    PayloadValidationError,
    UnknownJobTypeError,
)
"""What the command was given cannot be used: exit code 2, as click's own usage errors."""


class UsageFailure(click.ClickException):
    """``Error: <message>`` and exit code 2: a usage mistake (bad value, bad JSON, unknown
    type, invalid payload), as opposed to a runtime failure (exit code 1)."""

    exit_code = ConfigurationError.exit_code


class RefusedFailure(click.ClickException):
    """``Error: <message>`` and exit code 4: Kafka refused the credentials or the TLS handshake
    (:class:`KafkaAuthenticationError`), which no retry of the same command fixes."""

    exit_code = KafkaAuthenticationError.exit_code


@contextmanager
def cli_errors() -> Iterator[None]:
    """Turn a :class:`PipelineError` into ``Error: <message>`` on stderr: exit code 2 for a
    usage mistake (:data:`USAGE_ERRORS`), 4 when Kafka refused the credentials, 1 for anything
    else (Kafka unreachable or refusing a request).

    Use it as a context manager or as a decorator (``@cli_errors()``) under the click ones.
    """
    try:
        yield
    except USAGE_ERRORS as exc:
        raise UsageFailure(str(exc)) from exc
    except KafkaAuthenticationError as exc:
        raise RefusedFailure(str(exc)) from exc
    except PipelineError as exc:
        raise click.ClickException(str(exc)) from exc


def load_settings(
    *,
    bootstrap_servers: str | None = None,
    namespace: str | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Settings from the environment and ``config_file``; the given values win over both, and
    an invalid one is named by its option."""
    overrides: dict[str, Any] = {}
    if bootstrap_servers is not None:
        overrides["bootstrap_servers"] = bootstrap_servers
    if namespace is not None:
        overrides["namespace"] = namespace
    try:
        with reading_config_file(config_file):
            return Settings(**overrides)
    except ValidationError as exc:
        options = {name: "--" + name.replace("_", "-") for name in overrides}
        raise settings_error(exc, options=options) from exc


def load_app_option(spec: str | None) -> Pipeline | None:
    """The application named by an ``--app MODULE[:ATTR]`` option (``None`` without one); a
    spec that names no application is a usage error (exit code 2)."""
    if spec is None:
        return None
    from pipeline._loader import AppLoadError, load_app

    try:
        return load_app(spec)
    except AppLoadError as exc:
        raise click.BadParameter(str(exc), param_hint="'--app'") from None
    except Exception as exc:  # the application's own import failed: say what it raised
        raise click.BadParameter(
            f"importing the application failed: {type(exc).__name__}: {exc}",
            param_hint="'--app'",
        ) from exc


def app_settings(app: Pipeline, settings: Settings) -> Settings:
    """The settings of a command given ``--app``, as ``pipeline-worker --app`` takes them: the
    application's own (its namespace, servers, codec), with ``--bootstrap-servers`` and
    ``--namespace`` on top when given on the command line. ``--config`` is refused with
    ``--app``: the application has its settings, and a file the command ignored would mislead."""
    ctx = click.get_current_context()
    if ctx.params.get("config_file") is not None:
        raise click.UsageError(
            "--config and --app: the application's own settings are used with --app; give "
            "--bootstrap-servers or --namespace to change where it connects"
        )
    given = {
        name: getattr(settings, name)
        for name in ("bootstrap_servers", "namespace")
        if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    }
    return app.settings.model_copy(update=given) if given else app.settings


def _servers(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A ``--bootstrap-servers`` that names no server (``"$UNSET"``) is a usage mistake, not a
    Kafka that does not answer."""
    if value is not None and not any(part.strip() for part in value.split(",")):
        raise click.BadParameter(f"{value!r} names no server; give HOST:PORT[,...]")
    return value


def common_options(command: Callable[..., T]) -> Callable[..., T]:
    """Add ``--bootstrap-servers``, ``--namespace`` and ``--config``; pass ``settings=``.

    The command receives a built :class:`Settings` instead of the three options.
    """

    @click.option(
        "--bootstrap-servers",
        metavar="HOST:PORT[,...]",
        default=None,
        callback=_servers,
        help="Kafka bootstrap servers [default: $PIPELINE_BOOTSTRAP_SERVERS, else localhost:9092].",
    )
    @click.option(
        "--namespace",
        default=None,
        help="Prefix of every topic name, e.g. NAMESPACE.jobs.high "
        "[default: $PIPELINE_NAMESPACE, else pipeline].",
    )
    @click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        default=None,
        help="TOML settings file; environment variables and options win over it "
        "[default: $PIPELINE_CONFIG_FILE].",
    )
    @functools.wraps(command)
    def wrapper(
        *args: Any,
        bootstrap_servers: str | None,
        namespace: str | None,
        config_file: Path | None,
        **kwargs: Any,
    ) -> T:
        with cli_errors():
            settings = load_settings(
                bootstrap_servers=bootstrap_servers, namespace=namespace, config_file=config_file
            )
        return command(*args, settings=settings, **kwargs)

    return wrapper


ATTEMPTS_MAX = 2**31 - 1
"""The most attempts a job can carry (an Avro int)."""
REQUEST_MAX_S = 3600.0
"""The longest wait librdkafka takes for a request (its timeouts are at most an hour)."""
INTERVAL_MAX_S = 86_400.0
"""The longest interval between two reads (``--watch``, ``--interval``): a day."""


class Seconds(click.FloatRange):
    """A duration option: a finite number of seconds within its range (``FloatRange`` lets
    ``inf`` and ``nan`` through when there is no maximum, and ``nan`` through always)."""

    name = "number of seconds"

    def __init__(self, min: float, max: float | None = None) -> None:
        super().__init__(min=min, max=max)

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "SECONDS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        with contextlib.suppress(ValueError, TypeError):  # not a number: click says so below
            if not math.isfinite(float(value)):
                self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return super().convert(value, param, ctx)


def within_dates(value: str, epoch_ms: int) -> int:
    """``epoch_ms``, the time option value ``value`` names, when it falls between the years 1
    and 9999 (a datetime holds it, so it can be shown and sent); else a usage error."""
    if not EARLIEST_MS <= epoch_ms <= LATEST_MS:
        raise _out_of_range(value)
    return epoch_ms


def moment(value: str, *, refused: str | None = None) -> int:
    """Epoch milliseconds of a WHEN option: an ISO-8601 datetime or a duration ago
    (:func:`pipeline._deadletters.parse_when`) within :func:`within_dates`; else a usage error,
    ``refused`` if given (what the option accepts), else what ``parse_when`` says."""
    try:
        return within_dates(value, parse_when(value))
    except ValueError as exc:
        raise click.BadParameter(refused or str(exc)) from None
    except OverflowError:  # a duration of hundreds of digits: an infinite number of ms
        raise _out_of_range(value) from None


def _out_of_range(value: str) -> click.BadParameter:
    return click.BadParameter(
        f"{value!r} is out of range: a time must fall between 0001-01-01 and 9999-12-31"
    )


def timeout_option(command: F) -> F:
    """Add ``--timeout`` (30 s): how long Kafka may take to answer before the command fails as
    unreachable (at most librdkafka's hour)."""
    return click.option(
        "--timeout",
        type=Seconds(min=0.1, max=REQUEST_MAX_S),
        default=30.0,
        show_default=True,
        help="Seconds Kafka may take to answer before the command fails as unreachable.",
    )(command)


def json_option(command: F) -> F:
    """Add ``--json`` (passed as ``as_json``): machine-readable output for scripts."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON instead of a table, for scripts."
    )(command)


def _jsonable(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def print_json(obj: object) -> None:
    """Print ``obj`` as indented JSON; dataclasses, enums, paths and datetimes are converted."""
    click.echo(json.dumps(obj, indent=2, default=_jsonable))


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return str(value)


def _is_numeric(values: Sequence[object]) -> bool:
    return bool(values) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in values
    )


def print_table(
    rows: Iterable[Sequence[object]], columns: Sequence[str], *, err: bool = False
) -> None:
    """Print rows under a header, columns aligned; numbers right-aligned, ``None`` as ``-``."""
    rows = [list(row) for row in rows]
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [_is_numeric([r[i] for r in rows if r[i] is not None]) for i in range(len(columns))]

    def line(texts: Sequence[str]) -> str:
        parts = [
            t.rjust(widths[i]) if numeric[i] else t.ljust(widths[i]) for i, t in enumerate(texts)
        ]
        return "  ".join(parts).rstrip()

    click.echo(line([c.upper() for c in columns]), err=err)
    for row in cells:
        click.echo(line(row), err=err)


def json_object(ctx: click.Context, param: click.Parameter, value: str) -> dict[str, Any]:
    """A click callback: the option's value parsed as a JSON object (a handler's arguments).

    ``@PATH`` reads the JSON from a file and ``-`` from standard input, for payloads longer
    than a command line may be.
    """
    source = "the value"
    try:
        if value == "-":
            source = "standard input"
            value = sys.stdin.read()
        elif value.startswith("@"):
            source = value[1:]
            value = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {source}: {exc}") from None
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{source} is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # an integer of thousands of digits, or too deep
        raise click.BadParameter(f"{source} is JSON this command cannot read: {exc}") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(
            f"must be a JSON object of the handler's arguments, got {type(parsed).__name__}"
        )
    return parsed
