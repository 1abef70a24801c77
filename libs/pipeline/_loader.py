"""Finding the application object named by ``--app MODULE[:ATTR]``."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from ._app import Pipeline
from ._errors import PipelineError, SettingsError


class AppLoadError(PipelineError):
    """``--app`` does not name a :class:`pipeline.Pipeline`; the message says why."""


def load_app(spec: str) -> Pipeline:
    """Import ``MODULE`` and return its ``ATTR`` (default ``app``), a :class:`Pipeline`.

    The current directory is importable, as with ``python -m`` (and uvicorn, celery), so
    ``pipeline-worker --app myproject.jobs`` works from the project's root.
    """
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if not module_name or not all(part.isidentifier() for part in module_name.split(".")):
        raise AppLoadError(f"{spec!r} is not MODULE[:ATTR] (e.g. myproject.jobs:app)")
    if not all(part.isidentifier() for part in attr.split(".")):
        raise AppLoadError(f"{attr!r} is not an attribute name (e.g. app)")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise AppLoadError(
                f"cannot import module {module_name!r}: no module named {missing!r} "
                f"(searched from {cwd}; run from your project's root or fix PYTHONPATH)"
            ) from None
        raise
    value: object = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise AppLoadError(
                f"module {module_name!r} has no attribute {attr!r}; "
                f"name your Pipeline with --app {module_name}:NAME"
            ) from None
    if not isinstance(value, Pipeline):
        raise AppLoadError(
            f"{module_name}:{attr} is a {type(value).__name__}, not a pipeline.Pipeline"
        )
    return value


def load_app_for_service(spec: str) -> Pipeline:
    """:func:`load_app` for the ``--app`` option of ``pipeline-worker`` and ``pipeline-scheduler``.

    A spec that names no application is a usage error; an application whose module meets an
    invalid setting or fails to import prints why (the traceback for the latter) and exits 2.
    """
    try:
        return load_app(spec)
    except AppLoadError as exc:
        raise click.BadParameter(str(exc), param_hint="'--app'") from None
    except SettingsError as exc:  # the module's Pipeline() met an invalid setting
        click.echo(f"Error: {exc}", err=True)
        sys.exit(2)
    except Exception:
        click.echo(f"Error: importing the application {spec!r} failed:", err=True)
        click.echo(traceback.format_exc(), err=True)
        sys.exit(2)
