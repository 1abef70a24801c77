"""Invariants of the deployment files, as functions that list what is wrong (empty: fine),
so that the tests can also show each check catching a broken copy."""

from __future__ import annotations

import os
import typing
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from pydantic import BaseModel

from pipeline._errors import SettingsError
from pipeline._settings import Settings, build_settings

PREFIX = "PIPELINE_"
# Read by Settings itself rather than a field of it.
NOT_FIELDS = frozenset({"PIPELINE_CONFIG_FILE"})


def _unknown_setting(name: str) -> str | None:
    """Why ``name`` (PIPELINE_A__B) names no field of Settings, or None when it does."""
    model: type[BaseModel] = Settings
    parts = name.removeprefix(PREFIX).lower().split("__")
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return f"{name}: {part!r} is no setting of {model.__name__}"
        if depth == len(parts) - 1:
            return None
        annotation = field.annotation
        if typing.get_origin(annotation) is dict:
            return None  # a passthrough map (PIPELINE_KAFKA__...): any key is fine
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return f"{name}: {part!r} has no sub-settings"
        model = annotation
    return None


@contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {name: value for name, value in os.environ.items() if name.startswith(PREFIX)}
    for name in saved:
        del os.environ[name]
    os.environ.update(env)
    try:
        yield
    finally:
        for name in env:
            os.environ.pop(name, None)
        os.environ.update(saved)


def settings_from(env: Mapping[str, str]) -> Settings:
    """The Settings a process with exactly these PIPELINE_* variables builds."""
    wanted = {name: value for name, value in env.items() if name.startswith(PREFIX)}
    with _environment(wanted):
        return build_settings()


def setting_problems(env: Mapping[str, str]) -> list[str]:
    """Every PIPELINE_* variable that is no setting (Settings itself ignores an unknown
    top-level name, so each is looked up field by field), then any value it refuses."""
    problems = [
        why
        for name in sorted(env)
        if name.startswith(PREFIX) and name not in NOT_FIELDS
        for why in [_unknown_setting(name)]
        if why
    ]
    if not problems:
        try:
            settings_from(env)
        except SettingsError as exc:
            problems.append(str(exc))
    return problems


def env_of(container: Mapping[str, Any], objects: list[dict[str, Any]]) -> dict[str, str]:
    """A container's environment: its ConfigMaps (envFrom) overridden by its own env."""
    config_maps = {
        o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"
    }
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is not None:
            if ref["name"] not in config_maps:
                raise AssertionError(f"container {container['name']}: no ConfigMap {ref['name']}")
            env.update(config_maps[ref["name"]])
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
    return env


def env_names(container: Mapping[str, Any]) -> set[str]:
    """Names a container sets itself (value or valueFrom)."""
    return {item["name"] for item in container.get("env", [])}


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())
