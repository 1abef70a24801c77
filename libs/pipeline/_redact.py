"""Secrets are never shown: the one test of a name and the one redaction of values.

A setting, a librdkafka option (``kafka``, ``worker.kafka_consumer``) or a schema registry
client option (``schema_registry.client``) holds a secret when its name contains one of
:data:`SECRET_WORDS` (case-insensitive, whatever the separators: ``sasl.password``,
``ssl_key_password``, ``basic.auth.user.info``, a misspelled ``sasl_passwrd`` or an unknown
``foo_token``). A URL holds one in its user info (``https://user:secret@registry``, which
``SchemaRegistryClient`` takes as its basic auth): :func:`redact_url` hides the password and
keeps the rest. Wherever settings are shown, such a value is replaced by :data:`REDACTED`:
in settings errors (:func:`validation_problems`), in the ``repr`` of the settings models
(:class:`RedactedRepr`), and in pydantic's own ``ValidationError`` text, which the models
keep free of input values (``hide_input_in_errors``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

__all__ = [
    "REDACTED",
    "SECRET_WORDS",
    "RedactedRepr",
    "is_secret_name",
    "redact",
    "redact_url",
    "validation_problems",
]

REDACTED = "**********"
"""What a secret is shown as: the same stars as pydantic's ``SecretStr``."""

SECRET_WORDS = (
    "password",
    "passwd",
    "pwd",
    "secret",
    "token",
    "key",
    "credential",
    "auth",
    "private",
)
"""A name holding one of these words holds a secret (``auth`` covers ``basic.auth.user.info``
and ``sasl.oauthbearer.config``; ``key`` covers ``ssl.key.pem`` and ``ssl.keystore.*``)."""

_SCALARS = (str, bytes, int, float)

_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@\s,]*):[^/?#@\s,]*@")
"""``scheme://user:password@``: a URL's user info with a password (several URLs may be given
in one value, comma-separated, as a registry's are)."""


def is_secret_name(name: str) -> bool:
    """Whether a setting's or an option's name (or dotted path) says it holds a secret."""
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS)


def redact_url(text: str) -> str:
    """``text`` with the password of each URL in it replaced by :data:`REDACTED`."""
    return _URL_PASSWORD.sub(lambda found: f"{found['head']}:{REDACTED}@", text)


def redact(value: Any, name: str = "") -> Any:
    """``value`` with every secret in it replaced by :data:`REDACTED`.

    The whole value when ``name`` is a secret's (``None`` and booleans stay: they tell only
    whether something is set); in a mapping, each value under a secret's name, at any depth;
    in a list or tuple, each item under ``name``; in any other string, the password of a URL.
    """
    if isinstance(value, Mapping):
        return {key: redact(item, f"{name}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(item, name) for item in value)
    if name and is_secret_name(name) and value is not None and not isinstance(value, bool):
        return REDACTED
    if isinstance(value, str) and "@" in value:
        shown = redact_url(value)
        return value if shown == value else shown  # the same object when nothing is hidden
    return value


def validation_problems(
    exc: ValidationError, within: tuple[str, ...] = ()
) -> list[tuple[str, str]]:
    """``(dotted name, "message[, got value]")`` for each error of ``exc``.

    The value given is repeated only where it is a plain value (a string or a number) under a
    name that is not a secret's, and never for a name that is not a setting (``extra``): a
    misspelled or unknown name may hold a secret the spelling check cannot see.
    """
    problems = []
    for error in exc.errors(include_url=False):
        name = ".".join([*within, *(str(part) for part in error["loc"])])
        given = error["input"]
        shown = (
            error["type"] not in {"missing", "extra_forbidden"}
            and isinstance(given, _SCALARS)
            and redact(given, name) is given
        )
        problems.append((name, error["msg"] + (f", got {given!r}" if shown else "")))
    return problems


class RedactedRepr:
    """A settings model whose ``repr`` and ``str`` show secrets as :data:`REDACTED`, also
    inside its free-form option mappings (put it before ``BaseModel`` in the bases)."""

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():  # type: ignore[misc]
            yield name, redact(value, name or "")
