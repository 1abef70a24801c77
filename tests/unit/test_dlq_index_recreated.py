"""A dead-letter topic deleted and created again is told by its topic id, even once it grew
past its old end: the index drops what it held of the old topic and reads the new one from its
start. A cluster that gives no topic ids leaves the offsets alone to tell."""

from __future__ import annotations

import pytest

from pipeline._deadletters import ALL, LetterIndex, LetterStatus

from .test_dlq_index import DLQ, STATE, FakeLog, dead_letter, discarded, ids, index, log

__all__ = ["index", "log"]  # the fixtures


def held(index: LetterIndex) -> list[str]:
    return ids(index.query(status=ALL, limit=1000, newest_first=False).letters)


def recreate(log: FakeLog, topic: str, new_id: str) -> None:
    for where in log.partitions:
        if where[0] == topic:
            log.partitions[where] = []
    log.ids[topic] = new_id


def test_a_dlq_recreated_and_grown_past_its_old_end_is_read_again_from_its_start(
    log: FakeLog, index: LetterIndex
) -> None:
    """Its offsets alone cannot tell it: the index kept the old letters (counted, listed,
    offered for replay) and missed the new ones below the old end."""
    log.ids = {DLQ: "dlq-1", STATE: "state-1"}
    log.add_letters(0, [dead_letter(n) for n in range(3)])
    log.add_letters(1, [dead_letter(10)])
    log.add_states([discarded("dl-001")])
    index.refresh()
    assert len(index) == 4

    recreate(log, DLQ, "dlq-2")
    log.add_letters(0, [dead_letter(n) for n in range(50, 55)])  # past the old end (4)
    log.add_letters(1, [dead_letter(n) for n in (60, 61, 62)])  # past the old end (2)
    refreshed = index.refresh()
    assert held(index) == [f"dl-0{n}" for n in (50, 51, 52, 53, 54, 60, 61, 62)]
    assert (refreshed.letters, refreshed.expired, refreshed.states_dropped) == (8, 4, 1)
    assert index.stats().depth == 8

    log.add_letters(0, [dead_letter(70)])  # the same id from now on: read on from there
    assert index.refresh().letters == 1
    assert len(index) == 9


def test_a_recreated_dlq_state_is_read_again_and_the_old_states_dropped(
    log: FakeLog, index: LetterIndex
) -> None:
    log.ids = {DLQ: "dlq-1", STATE: "state-1"}
    log.add_letters(0, [dead_letter(n) for n in range(4)])
    log.add_states([discarded("dl-000"), discarded("dl-001"), discarded("dl-002")])
    index.refresh()
    assert index.counts()["discarded"] == 3

    recreate(log, STATE, "state-2")
    log.add_states([discarded("dl-003"), discarded("dl-099"), discarded("dl-098")])
    log.add_states([discarded("dl-097")])  # past the old end (3 records and a marker)
    refreshed = index.refresh()
    assert index.counts() == {"pending": 3, "replayed": 0, "discarded": 1}
    assert {s.letter.id: s.status for s in index.query(status="discarded").letters} == {
        "dl-003": LetterStatus.DISCARDED
    }
    assert set(index._states) == {"dl-003", "dl-099", "dl-098", "dl-097"}  # orphans, for now
    assert refreshed.states == 4
    index.refresh()
    assert set(index._states) == {"dl-003"}


def test_without_topic_ids_only_the_offsets_tell(log: FakeLog, index: LetterIndex) -> None:
    log.add_letters(0, [dead_letter(n) for n in range(3)])
    index.refresh()
    recreate(log, DLQ, "")
    del log.ids[DLQ]  # the cluster gives none
    log.add_letters(0, [dead_letter(n) for n in range(50, 55)])
    index.refresh()
    # What the docs say cannot be told apart: the old letters stay, read on from the old end.
    assert held(index) == ["dl-000", "dl-001", "dl-002", "dl-054"]


@pytest.mark.parametrize("with_ids", [True, False])
def test_a_dlq_recreated_with_fewer_partitions_drops_the_letters_of_those_gone(
    log: FakeLog, index: LetterIndex, with_ids: bool
) -> None:
    """Only the partitions the new topic has were read again: the letters of the others stayed
    for good, counted and offered for replay."""
    if with_ids:
        log.ids = {DLQ: "dlq-1", STATE: "state-1"}
    log.add_letters(0, [dead_letter(n) for n in range(3)])
    log.add_letters(1, [dead_letter(10), dead_letter(11)])
    index.refresh()
    assert len(index) == 5

    del log.partitions[(DLQ, 1)]
    recreate(log, DLQ, "dlq-2")
    # Without ids, only a partition that did not grow past its old end tells (see above).
    new = range(50, 55) if with_ids else range(50, 52)
    log.add_letters(0, [dead_letter(n) for n in new])
    index.refresh()
    assert held(index) == [f"dl-0{n}" for n in new]
    assert index.stats().depth == len(new)
