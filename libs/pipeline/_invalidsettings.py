"""Invalid settings: the message that names each one and where its value came from, and the
sections a service never reads, which it warns about instead of failing on."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from ._errors import SettingsError
from ._redact import validation_problems

__all__ = ["settings_error", "unused_scope", "unused_sections"]

_log = logging.getLogger("pipeline.settings")


def settings_error(
    exc: ValidationError, within: tuple[str, ...] = (), options: Mapping[str, str] | None = None
) -> SettingsError:
    """A :class:`SettingsError` naming each invalid setting and where its value came from:
    the command-line option that gave it (``options`` maps a setting's dotted name to the
    option, ``{"namespace": "--namespace"}``), else the environment variable when one is set.
    ``within`` is where the validated model sits in :class:`Settings` (``("worker",)`` for
    :class:`WorkerSettings`). A value is repeated only where it cannot be a secret
    (:func:`pipeline._redact.validation_problems`)."""
    problems = _problems(exc, within, options or {})
    fix = "command line, environment" if options else "environment"
    return SettingsError(
        "invalid settings: " + "; ".join(problems) + f". Fix the value ({fix}, config file "
        "or code) and start again"
    )


def _problems(
    exc: ValidationError, within: tuple[str, ...], options: Mapping[str, str]
) -> list[str]:
    environ = {name.upper() for name in os.environ}
    problems = []
    for name, problem in validation_problems(exc, within):
        variable = "PIPELINE_" + name.replace(".", "__").upper()
        if name in options:  # the option won over the variable, when one is set too
            where = f" (option {options[name]})"
        elif name and variable in environ:
            where = f" (environment variable {variable})"
        else:
            where = ""
        problems.append(f"{name or 'settings'}{where}: {problem}")
    return problems


@dataclass
class UnusedSections:
    """The sections of :class:`Settings` that ``service`` never reads (see
    :func:`unused_sections`), and the warnings already given about them."""

    service: str
    sections: frozenset[str]
    warned: set[str] = field(default_factory=set)

    def checked(self, cls: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
        """``data``, the input of the settings model ``cls``, without the unused sections that
        are invalid, each warned about once."""
        kept = dict(data)
        for section in sorted(self.sections & data.keys()):
            model = cls.model_fields[section].annotation
            assert isinstance(model, type)
            assert issubclass(model, BaseModel)
            try:
                model.model_validate(data[section])
            except ValidationError as exc:
                del kept[section]  # its defaults stand in: nothing in this process reads them
                problems = "; ".join(_problems(exc, (section,), {}))
                if problems not in self.warned:
                    self.warned.add(problems)
                    _log.warning(
                        "%s does not use the %s settings and ignores these invalid ones: %s",
                        self.service,
                        section,
                        problems,
                    )
        return kept


_unused: ContextVar[UnusedSections | None] = ContextVar("pipeline_unused_sections", default=None)


def unused_scope() -> UnusedSections | None:
    """The sections the settings built now may take as unset when invalid, if any."""
    return _unused.get()


@contextmanager
def unused_sections(service: str, *sections: str) -> Iterator[None]:
    """While inside, a :class:`Settings` built in this thread (by ``service`` itself, or by the
    ``Pipeline()`` of the application it imports) takes an invalid section among ``sections``
    (names of :class:`Settings` fields that ``service`` never reads, e.g. ``"worker"`` for the
    scheduler) as unset, with a warning, instead of failing: a bad worker setting in an
    environment or a config file the services share must not stop the scheduler."""
    token = _unused.set(UnusedSections(service, frozenset(sections)))
    try:
        yield
    finally:
        _unused.reset(token)
