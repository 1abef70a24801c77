"""Counts of a dead-letter snapshot: by status, and the pending ones by reason and type."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .._settings import Settings
from ._reader import read_dead_letters
from ._state import DeadLetterSnapshot, LetterStatus


@dataclass(frozen=True, slots=True)
class DlqStats:
    """Counts of a snapshot; ``depth`` (pending dead letters) is the number to alert on."""

    by_status: dict[str, int]
    pending_by_reason: dict[str, int]
    pending_by_type: dict[str, int]
    undecodable: int

    @property
    def depth(self) -> int:
        return self.by_status[LetterStatus.PENDING.value]


def dlq_stats(snapshot: DeadLetterSnapshot) -> DlqStats:
    statuses = Counter(s.status.value for s in snapshot.letters)
    pending = [s.letter for s in snapshot.letters if s.status is LetterStatus.PENDING]
    reasons = Counter(letter.reason for letter in pending)
    types = Counter(letter.job_type or "(unknown)" for letter in pending)
    return DlqStats(
        by_status={status.value: statuses[status.value] for status in LetterStatus},
        pending_by_reason=_by_count(reasons),
        pending_by_type=_by_count(types),
        undecodable=snapshot.undecodable,
    )


def _by_count(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def dlq_depth(settings: Settings, *, timeout: float = 30.0) -> int:
    """How many dead letters are pending: neither replayed nor discarded."""
    return dlq_stats(read_dead_letters(settings, timeout=timeout)).depth
