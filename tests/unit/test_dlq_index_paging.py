"""Paging the dead-letter index by position: ``before`` / ``after`` a letter's
``letter_order``, rather than by a count of letters that shifts as letters come and go."""

from __future__ import annotations

import pytest

from pipeline._deadletters import ALL, LetterFilter, LetterIndex, LetterPage, letter_order
from pipeline._records import DeadLetter

from .test_dlq_index import FakeLog, dead_letter, discarded, ids, index, log

__all__ = ["index", "log"]  # the fixtures


def _ids(*numbers: int) -> list[str]:
    return [f"dl-{n:03d}" for n in numbers]


def _fill(log: FakeLog, index: LetterIndex, numbers: range) -> None:
    log.add_letters(0, [dead_letter(n) for n in numbers if n % 2 == 0])
    log.add_letters(1, [dead_letter(n) for n in numbers if n % 2])
    index.refresh()


def _shown(page: LetterPage) -> tuple[list[str], int, bool, bool]:
    return ids(page.letters), page.offset, page.has_previous, page.has_next


def test_a_page_before_a_letter_starts_right_after_it_whatever_died_since(
    log: FakeLog, index: LetterIndex
) -> None:
    _fill(log, index, range(10))
    first = index.query(status=ALL, limit=3)
    assert _shown(first) == (_ids(9, 8, 7), 0, False, True)
    _fill(log, index, range(10, 15))
    second = index.query(status=ALL, limit=3, before=letter_order(first.letters[-1]))
    assert _shown(second) == (_ids(6, 5, 4), 8, True, True)
    back = index.query(status=ALL, limit=3, after=letter_order(second.letters[0]))
    assert _shown(back) == (_ids(9, 8, 7), 5, True, True)
    third = index.query(status=ALL, limit=3, before=letter_order(second.letters[-1]))
    assert _shown(third) == (_ids(3, 2, 1), 11, True, True)
    last = index.query(status=ALL, limit=3, before=letter_order(third.letters[-1]))
    assert _shown(last) == ([*_ids(0)], 14, True, False)
    # offset counts from the position; oldest first, the nearest letters come first too.
    skipped = index.query(status=ALL, limit=2, offset=1, before=letter_order(second.letters[0]))
    assert ids(skipped.letters) == _ids(4, 3)
    oldest = index.query(
        status=ALL, limit=3, newest_first=False, after=letter_order(second.letters[0])
    )
    assert _shown(oldest) == (_ids(7, 8, 9), 7, True, True)
    older = index.query(
        status=ALL, limit=3, newest_first=False, before=letter_order(second.letters[0])
    )
    assert _shown(older) == (_ids(3, 4, 5), 3, True, True)


def test_a_position_holds_when_its_letter_and_others_leave_the_status_asked_for(
    log: FakeLog, index: LetterIndex
) -> None:
    _fill(log, index, range(10))
    first = index.query(limit=3)  # pending
    log.add_states([discarded(i) for i in _ids(9, 8, 7, 5)])
    index.refresh()
    # dl-007 is no longer pending: its position still says where page 2 starts.
    second = index.query(limit=3, before=letter_order(first.letters[-1]))
    assert _shown(second) == (_ids(6, 4, 3), 0, False, True)
    newer = index.query(limit=3, after=letter_order(first.letters[-1]))
    assert _shown(newer) == ([], 0, False, True)


def test_a_position_is_found_without_a_scan(
    log: FakeLog, index: LetterIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(log, index, range(10))
    emails = LetterFilter(types=("email.*",))
    first = index.query(emails, limit=3)
    tried: list[DeadLetter] = []
    matches = LetterFilter.matches

    def counted(letter_filter: LetterFilter, letter: DeadLetter) -> bool:
        tried.append(letter)
        return matches(letter_filter, letter)

    monkeypatch.setattr(LetterFilter, "matches", counted)
    assert ids(index.query(emails, limit=3, before=letter_order(first.letters[-1])).letters) == (
        _ids(6, 5, 4)
    )
    assert tried == []


def test_before_and_after_together_are_refused(index: LetterIndex) -> None:
    with pytest.raises(ValueError, match="before or after, not both"):
        index.query(before=(0, 0, 0), after=(1, 0, 0))
