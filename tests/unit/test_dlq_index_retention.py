"""The dead-letter index's table of states stays as big as the letters on ``<ns>.dlq``: the
states of letters that retention deleted (below the partition's low watermark) are dropped,
those of letters still on the topic are kept, read before their letters or not."""

from __future__ import annotations

from pipeline._deadletters import ALL, LetterFilter, LetterIndex, LetterStatus

from .test_dlq_index import (
    DLQ,
    FakeLog,
    dead_letter,
    discarded,
    ids,
    index,
    log,
    replayed,
)

__all__ = ["index", "log"]  # the fixtures


def statuses(index: LetterIndex) -> dict[str, LetterStatus]:
    return {s.letter.id: s.status for s in index.query(status=ALL, limit=1000).letters}


def test_states_of_letters_deleted_by_retention_leave_with_them(
    log: FakeLog, index: LetterIndex
) -> None:
    log.add_letters(0, [dead_letter(n) for n in range(4)])
    log.add_letters(1, [dead_letter(n) for n in (10, 11)])
    log.add_states([discarded("dl-000"), replayed("dl-001"), discarded("dl-003")])
    log.add_states([replayed("dl-010")])
    index.refresh()
    # A view that leaves letters out deletes nothing: the states are the topic's, not a page's.
    assert index.query(LetterFilter(types=("nothing.*",)), status=ALL).total == 0
    index.refresh()
    assert set(index._states) == {"dl-000", "dl-001", "dl-003", "dl-010"}

    log.low[DLQ, 0] = 2  # retention deleted dl-000 and dl-001 (partition 1 keeps all)
    refreshed = index.refresh()
    assert set(index._states) == {"dl-003", "dl-010"}
    assert (refreshed.expired, refreshed.states_dropped) == (2, 2)
    assert statuses(index) == {
        "dl-002": LetterStatus.PENDING,
        "dl-003": LetterStatus.DISCARDED,
        "dl-010": LetterStatus.REPLAYED,
        "dl-011": LetterStatus.PENDING,
    }


def test_the_states_table_does_not_grow_with_the_letters_retention_deleted(
    log: FakeLog, index: LetterIndex
) -> None:
    for batch in range(5):
        letters = [dead_letter(batch * 100 + n) for n in range(100)]
        log.add_letters(0, letters)
        log.add_states(discarded(d.id) for d in letters)
        index.refresh()
        assert len(index._states) == 100
        log.low[DLQ, 0] = len(log.partitions[DLQ, 0])  # all deleted
        index.refresh()
        assert (len(index), len(index._states)) == (0, 0)


def test_states_of_letters_deleted_before_the_index_read_them_are_dropped_after_a_full_read(
    log: FakeLog, index: LetterIndex
) -> None:
    # A state is written after its letter, so <ns>.dlq-state (deleted by time too) keeps it a
    # while after the letter left <ns>.dlq: the first refresh reads such states.
    log.add_letters(0, [dead_letter(n) for n in range(4)])
    log.add_states([discarded(f"dl-00{n}") for n in range(4)])
    log.low[DLQ, 0] = 2
    index.refresh()
    assert ids(index.query(status=ALL, newest_first=False).letters) == ["dl-002", "dl-003"]
    # A state read without its letter may be one whose letter the read did not reach yet.
    assert set(index._states) == {"dl-000", "dl-001", "dl-002", "dl-003"}
    refreshed = index.refresh()  # to the end of <ns>.dlq again: no letter claims them
    assert set(index._states) == {"dl-002", "dl-003"}
    assert refreshed.states_dropped == 2
    assert set(statuses(index).values()) == {LetterStatus.DISCARDED}


def test_a_state_read_before_its_letter_is_kept_for_the_letter(
    log: FakeLog, index: LetterIndex
) -> None:
    # The index asks the end of <ns>.dlq before that of <ns>.dlq-state: a letter written
    # between the two, and replayed at once, has its state read one refresh before it.
    log.add_letters(0, [dead_letter(0)])
    log.add_states([replayed("dl-001")])
    index.refresh()
    log.add_letters(1, [dead_letter(1)])
    refreshed = index.refresh()
    assert refreshed.states_dropped == 0
    index.refresh()
    assert statuses(index) == {"dl-000": LetterStatus.PENDING, "dl-001": LetterStatus.REPLAYED}
    assert set(index._states) == {"dl-001"}


def test_a_deep_topic_read_in_steps_keeps_the_states_of_the_letters_not_read_yet(
    log: FakeLog, index: LetterIndex
) -> None:
    letters = [dead_letter(n) for n in range(12)]
    log.add_letters(0, letters)
    log.add_states(discarded(d.id) for d in letters)
    log.add_states([discarded("dl-999")])  # a letter deleted before the index started
    index.refresh(limit=2)
    while not index.caught_up:
        assert len(index._states) == 13  # nothing dropped before the whole topic was read
        index.refresh(limit=2)
    assert len(index) == 12
    assert set(statuses(index).values()) == {LetterStatus.DISCARDED}
    assert set(index._states) == {d.id for d in letters}  # dl-999 claimed by none


def test_the_letters_of_a_topic_deleted_and_created_again_leave_with_it(
    log: FakeLog, index: LetterIndex
) -> None:
    """Kept, they were counted as pending, listed and offered for replay for good, and a bulk
    action asked again and again, the index never matching the topic."""
    log.add_letters(0, [dead_letter(n) for n in range(10)])
    log.add_letters(1, [dead_letter(n) for n in (20, 21)])
    log.add_states([discarded("dl-001")])
    index.refresh()
    log.partitions[DLQ, 0] = []  # deleted, and created again by `pipeline topics apply`
    log.partitions[DLQ, 1] = []
    log.add_letters(0, [dead_letter(n) for n in (50, 51)])
    refreshed = index.refresh()
    assert set(statuses(index)) == {"dl-050", "dl-051"}
    assert (refreshed.expired, refreshed.states_dropped) == (12, 1)
    assert index.stats().depth == 2
