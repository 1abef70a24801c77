"""The dead-letter index's answers to its last queries, kept until its next refresh, so that
paging through a result does not scan every letter again."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._state import LetterStatus, letter_order

if TYPE_CHECKING:
    from ._filters import LetterFilter
    from ._state import LetterKey, StoredLetter

_CACHED_QUERIES = 16


@dataclass(slots=True)
class Matches:
    """The letters that match one filter, oldest first, with their count per status."""

    letters: list[StoredLetter]
    by_status: dict[str, int] = field(default_factory=dict)

    def window(
        self,
        *,
        offset: int,
        limit: int,
        newest_first: bool,
        before: LetterKey | None = None,
        after: LetterKey | None = None,
    ) -> tuple[list[StoredLetter], int]:
        """At most ``limit`` of these letters, newest first or oldest first, and how many come
        before them in that order. Without a cursor they start ``offset`` letters from the
        first. ``before`` (``after``), a :func:`letter_order` key, keeps only the letters
        strictly older (newer) than it and takes the nearest to it, ``offset`` counted from it:
        letters added or gone elsewhere do not move the page. The key is found by bisection
        (the letters are in :func:`letter_order`), not by a scan."""
        low, high = 0, len(self.letters)
        if before is not None:
            high = bisect_left(self.letters, before, key=letter_order)
        if after is not None:
            low = bisect_right(self.letters, after, key=letter_order)
        if before is not None or (after is None and newest_first):  # nearest the newest end
            stop = max(low, high - offset)
            start = max(low, stop - limit)
        else:
            start = min(high, low + offset)
            stop = min(high, start + limit)
        page = self.letters[start:stop]
        if newest_first:
            return page[::-1], len(self.letters) - stop
        return page, start


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
