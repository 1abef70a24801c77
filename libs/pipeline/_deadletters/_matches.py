"""The dead-letter index's answers to its last queries, kept until its next refresh, so that
paging through a result does not scan every letter again."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._state import LetterStatus

if TYPE_CHECKING:
    from ._filters import LetterFilter
    from ._state import StoredLetter

_CACHED_QUERIES = 16


@dataclass(slots=True)
class Matches:
    """The letters that match one filter, oldest first, with their count per status."""

    letters: list[StoredLetter]
    by_status: dict[str, int] = field(default_factory=dict)


class MatchCache:
    """The :class:`Matches` of the last few filters and statuses asked (``None``: any). Not
    thread-safe: the index calls it under its lock, and clears it when a refresh changes
    the letters or their states."""

    def __init__(self) -> None:
        self._cache: OrderedDict[tuple[LetterFilter, LetterStatus | None], Matches] = OrderedDict()

    def clear(self) -> None:
        self._cache.clear()

    def matches(
        self, letters: list[StoredLetter], letter_filter: LetterFilter, status: LetterStatus | None
    ) -> Matches:
        """The ``letters`` (oldest first) that match ``letter_filter`` in ``status``."""
        key = (letter_filter, status)
        if (found := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            return found
        every = self._cache.get((letter_filter, None))
        if every is None:
            if not letter_filter.empty:
                letters = [s for s in letters if letter_filter.matches(s.letter)]
            counts = dict.fromkeys((s.value for s in LetterStatus), 0)
            for stored in letters:
                counts[stored.status.value] += 1
            every = self._remember((letter_filter, None), Matches(letters, counts))
        if status is None:
            return every
        chosen = [s for s in every.letters if s.status is status]
        return self._remember(key, Matches(chosen, every.by_status))

    def _remember(self, key: tuple[LetterFilter, LetterStatus | None], found: Matches) -> Matches:
        self._cache[key] = found
        while len(self._cache) > _CACHED_QUERIES:
            self._cache.popitem(last=False)
        return found
