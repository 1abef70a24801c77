"""Invalid settings: the message that names each one and where its value came from, and the
sections a service never reads, which it warns about instead of failing on."""

from __future__ import annotations

import json
import logging
import os
import re
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from ._errors import SettingsError
from ._redact import validation_problems

__all__ = ["settings_error", "unreadable_variables", "unused_scope", "unused_sections"]

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


_FIELD = re.compile(r'field "(\w+)"')
_COMPOUND = (dict, list, set, frozenset, tuple)


def unreadable_variables(exc: Exception, model: type[BaseModel]) -> SettingsError:
    """A :class:`SettingsError` for pydantic-settings' own (an environment variable of a list
    or mapping setting that is not JSON): naming the variable, where its message names only the
    section (``error parsing value for field "worker"``)."""
    found = _FIELD.search(str(exc))
    section = found.group(1) if found else ""
    prefix = f"PIPELINE_{section.upper()}"
    names = sorted(
        name
        for name, value in os.environ.items()
        if (name.upper() == prefix or name.upper().startswith(prefix + "__"))
        and _compound(model, name.upper().removeprefix("PIPELINE_").lower().split("__"))
        and not _is_json(value)
    )
    named = ", ".join(names) or f"a variable {prefix}__*"
    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    return SettingsError(
        f"invalid settings: {named} is not JSON{cause}, which a list or mapping setting takes "
        """('{"key": "value"}', '["a", "b"]'). Fix the value (environment) and start again"""
    )


def _compound(model: type[BaseModel], path: list[str]) -> bool:
    """Whether the setting at ``path`` (lowercased names below ``model``) takes a list or a
    mapping, or a section that is read from JSON as a whole."""
    annotation: Any = model
    for part in path:
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return True  # a key inside a mapping setting: its value is read as JSON too
        field = annotation.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
    return _takes_json(annotation)


def _takes_json(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_takes_json(arg) for arg in get_args(annotation) if arg is not type(None))
    if origin is not None:
        return origin in _COMPOUND or (isinstance(origin, type) and issubclass(origin, Mapping))
    return isinstance(annotation, type) and issubclass(annotation, (BaseModel, *_COMPOUND))


def _is_json(value: str) -> bool:
    try:
        json.loads(value)
    except ValueError:
        return False
    return True


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
