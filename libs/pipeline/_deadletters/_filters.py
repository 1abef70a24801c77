"""Which dead letters a command acts on: criteria, and the times operators type."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase

from .._job import now_ms
from .._records import DeadLetter

_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


EARLIEST_MS = -62_135_596_800_000
"""0001-01-01T00:00:00Z in epoch milliseconds: the first time a datetime holds."""
LATEST_MS = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z in epoch milliseconds: the last time a datetime holds."""


def is_duration_ago(text: str) -> bool:
    """Whether ``text`` is a duration ago (``30m``, ``2h``...), which :func:`parse_when` reads
    as another time at every call, rather than a time."""
    return _DURATION.fullmatch(text.strip()) is not None


def parse_when(text: str, *, now: int | None = None) -> int:
    """Epoch milliseconds of ``text``: an ISO-8601 date or datetime (UTC unless it names an
    offset), or a duration ago such as ``45s``, ``30m``, ``2h``, ``7d``, ``2w`` or ``1h30m``.

    Raises ``ValueError`` saying what is accepted.
    """
    value = text.strip()
    if _DURATION.fullmatch(value):
        ago = sum(float(n) * _UNIT_MS[unit] for n, unit in _DURATION_PART.findall(value))
        return (now_ms() if now is None else now) - round(ago)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO-8601 datetime (e.g. 2025-01-31T12:00:00Z, "
            "2025-01-31) nor a duration ago (e.g. 30m, 2h, 7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class LetterFilter:
    """Which dead letters a command acts on. Every given criterion must hold; several values
    of one criterion are alternatives. ``since`` is inclusive, ``until`` exclusive (epoch ms of
    ``dead_at``); ``types`` take shell wildcards; ``error`` is a case-insensitive substring of
    the error class or message of the dead letter or of any attempt; ``ids`` match dead-letter
    ids and job ids."""

    types: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    error: str | None = None
    since: int | None = None
    until: int | None = None
    tenants: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Reasons compare without case: lowered once here, not for every letter matched.
        object.__setattr__(self, "reasons", tuple(r.lower() for r in self.reasons))

    @property
    def empty(self) -> bool:
        """True when it matches every dead letter."""
        return self == LetterFilter()

    def matches(self, letter: DeadLetter) -> bool:
        return (
            (not self.ids or letter.id in self.ids or letter.job_id in self.ids)
            and (not self.types or _type_matches(letter.job_type, self.types))
            and (not self.reasons or letter.reason.lower() in self.reasons)
            and (not self.tenants or letter.tenant in self.tenants)
            and (self.since is None or letter.dead_at >= self.since)
            and (self.until is None or letter.dead_at < self.until)
            and (self.error is None or _has_error_text(letter, self.error.lower()))
        )


def _type_matches(job_type: str | None, patterns: tuple[str, ...]) -> bool:
    return job_type is not None and any(fnmatchcase(job_type, p) for p in patterns)


def _has_error_text(letter: DeadLetter, needle: str) -> bool:
    texts = [letter.error_class or "", letter.message]
    if letter.job is not None:
        for error in letter.job.errors:
            texts += [error.error_class, error.message]
    return any(needle in text.lower() for text in texts)
