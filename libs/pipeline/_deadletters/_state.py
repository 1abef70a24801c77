"""What was done to each dead letter: the ``<ns>.dlq-state`` records, folded into a table.

What an operator did with a dead letter lives on the compacted one-partition ``<ns>.dlq-state``
topic, keyed by dead-letter id, as JSON (``{"status": "replayed", "at": ms, "by": "user@host",
"to": topic, "job_id": ...}``); the later record for a key wins.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .._errors import PipelineError
from .._jsonpayload import read_json
from .._records import DeadLetter

if TYPE_CHECKING:
    from ._filters import LetterFilter

_log = logging.getLogger("pipeline.dlq")


class DeadLetterNotFoundError(PipelineError, LookupError):
    """No dead letter has the id (or the job id is ambiguous)."""


class LetterStatus(StrEnum):
    PENDING = "pending"
    REPLAYED = "replayed"
    DISCARDED = "discarded"


@dataclass(frozen=True, slots=True, kw_only=True)
class LetterState:
    """One record of ``<ns>.dlq-state``: what was done to a dead letter, when and by whom."""

    status: LetterStatus
    at: int
    by: str
    to: str | None = None
    job_id: str | None = None

    def to_json(self) -> bytes:
        record: dict[str, Any] = {"status": self.status.value, "at": self.at, "by": self.by}
        if self.to is not None:
            record["to"] = self.to
        record["job_id"] = self.job_id
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LetterState:
        """Raises ``ValueError`` for anything that is not a state record. A ``pending`` record
        needs no time: it only puts a dead letter back to pending, as a tombstone does (and it
        is the one an operator writes by hand)."""
        record = read_json(data)
        pending = isinstance(record, dict) and record.get("status") == LetterStatus.PENDING.value
        if (
            not isinstance(record, dict)
            or not (isinstance(record.get("at"), int) or pending)
            or not all(isinstance(record.get(f), str | None) for f in ("to", "job_id"))
        ):
            # ``to`` and ``job_id`` are printed and looked up as text: another writer's record
            # with a number or a list there is no record of this table.
            raise ValueError(f"not a dead-letter state record: {data[:100]!r}")
        return cls(
            status=LetterStatus(str(record.get("status"))),
            at=record.get("at", 0),
            by=str(record.get("by") or "?"),
            to=record.get("to"),
            job_id=record.get("job_id"),
        )


def fold_states(
    records: Iterable[tuple[str, bytes | None]], into: dict[str, LetterState] | None = None
) -> dict[str, LetterState]:
    """The state table from ``(key, value)`` records in log order: the later record wins, and a
    tombstone or a ``pending`` record puts a dead letter back to pending. With ``into``, the
    records are folded into that table (changed in place and returned): the records that came
    after it was made."""
    states: dict[str, LetterState] = {} if into is None else into
    for key, value in records:
        state = None
        if value is not None:
            try:
                state = LetterState.from_json(value)
            except (ValueError, TypeError) as exc:
                _log.warning("ignoring an invalid dead-letter state record for %s: %s", key, exc)
                continue
        if state is None or state.status is LetterStatus.PENDING:
            states.pop(key, None)
        else:
            states[key] = state
    return states


@dataclass(slots=True)
class StoredLetter:
    """A dead letter, where it is on ``<ns>.dlq``, and its state (``None``: pending)."""

    letter: DeadLetter
    partition: int
    offset: int
    state: LetterState | None = None

    @property
    def status(self) -> LetterStatus:
        return LetterStatus.PENDING if self.state is None else self.state.status


LetterKey = tuple[int, int, int]
"""A letter's place in :func:`letter_order`: ``(dead_at, partition, offset)``."""


def letter_order(stored: StoredLetter) -> LetterKey:
    """The order dead letters are listed in, oldest first: ``dead_at``, then the position."""
    return (stored.letter.dead_at, stored.partition, stored.offset)


@dataclass(slots=True)
class DeadLetterSnapshot:
    """``<ns>.dlq`` as of one read, oldest first, with the records that could not be decoded."""

    topic: str
    letters: list[StoredLetter]
    undecodable: int = 0

    def select(self, letter_filter: LetterFilter) -> list[StoredLetter]:
        return [s for s in self.letters if letter_filter.matches(s.letter)]

    def find(self, ident: str) -> StoredLetter:
        """The dead letter with id ``ident``, or the only one holding job ``ident``."""
        for stored in self.letters:
            if stored.letter.id == ident:
                return stored
        of_job = [s for s in self.letters if s.letter.job_id == ident]
        if len(of_job) == 1:
            return of_job[0]
        if of_job:
            ids = ", ".join(s.letter.id for s in of_job)
            raise DeadLetterNotFoundError(
                f"job {ident} has {len(of_job)} dead letters ({ids}); give one dead-letter id"
            )
        raise DeadLetterNotFoundError(
            f"no dead letter or job with id {ident!r} on {self.topic}; "
            "`pipeline dlq ls --all` lists them"
        )


def actionable(
    letters: Iterable[StoredLetter],
    *,
    force: bool = False,
    states: Mapping[str, LetterState] | None = None,
) -> tuple[list[StoredLetter], Counter[LetterStatus]]:
    """The pending letters (all of them with ``force``), and how many were skipped, by status.

    ``states``: the letters' states as they are now, read again just before acting; each letter
    is returned with it. ``force`` then takes only a letter whose state is still the one it was
    read with: one someone else replayed or discarded since is skipped, as forcing it would send
    it a second time."""
    todo: list[StoredLetter] = []
    skipped: Counter[LetterStatus] = Counter()
    for seen in letters:
        stored = seen if states is None else replace(seen, state=states.get(seen.letter.id))
        if stored.status is LetterStatus.PENDING or (force and stored.state == seen.state):
            todo.append(stored)
        else:
            skipped[stored.status] += 1
    return todo, skipped
