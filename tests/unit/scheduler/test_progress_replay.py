"""A term that commits while it replays a partition keeps what the previous term recorded.

A new leader reads a partition again from the watermark and skips what the last record says
was released or moved. Until it has read up to that record's position, its own record must
still say so: a third leader (a second failover, a rolling restart) would otherwise release
those jobs again.
"""

from __future__ import annotations

import random

from pipeline_scheduler._progress import PartitionProgress, SavedProgress


def read(progress: PartitionProgress, offsets: range) -> list[int]:
    """Read ``offsets`` as the leader does; return those it routes (not skipped)."""
    routed = []
    for offset in offsets:
        progress.delivered(offset)
        if not progress.finished_before(offset):
            routed.append(offset)
        progress.processed(offset)
    return routed


def test_a_record_written_during_a_replay_still_skips_what_was_released_before() -> None:
    # First term: 0..9 read; 0 and 5 held, every other offset released.
    first = SavedProgress.holding(0, 10, (0, 5))
    # Second term: reads 0..3 (0 held again), releases 0 and commits, then dies.
    second = PartitionProgress(committed=0, saved=first)
    assert read(second, range(4)) == [0]
    second.hold(0)
    second.release(0)
    record = second.saved()
    assert record is not None
    # Third term: from that record, only 5 (still held when the first term's record was
    # written) and what comes after 9 are routed again.
    third = PartitionProgress(committed=record.watermark, saved=record)
    assert read(third, range(record.watermark, 12)) == [5, 10, 11]


def test_offsets_held_by_the_replay_and_not_yet_reached_both_stay_held() -> None:
    first = SavedProgress.holding(3, 20, (3, 8, 15))
    second = PartitionProgress(committed=3, saved=first)
    assert read(second, range(3, 10)) == [3, 8]
    second.hold(8)  # 3 released at once, 8 waits in memory
    assert second.saved() == SavedProgress.holding(8, 20, (8, 15))
    # Once the replay is past the old position, the record is the term's own.
    assert read(second, range(10, 22)) == [15, 20, 21]
    second.release(8)
    assert second.saved() == SavedProgress(22, 22)


def test_a_replaying_record_names_what_is_held_and_the_rest_of_the_last_one_in_any_order() -> None:
    # The record is made of runs, never of expanded offsets (a leader replaying a million held
    # offsets writes one at every commit); what it names must be the offsets held now below
    # the position and those the last record held from the position on, as one set would.
    rnd = random.Random(7)
    for _ in range(200):
        watermark = rnd.randrange(50)
        position = watermark + rnd.randrange(1, 80)
        last = [o for o in range(watermark, position) if rnd.random() < 0.4]
        progress = PartitionProgress(
            committed=watermark, saved=SavedProgress.holding(watermark, position, last)
        )
        held: set[int] = set()
        for offset in range(watermark, position + 10):
            progress.delivered(offset)
            if not progress.finished_before(offset) and rnd.random() < 0.5:
                progress.hold(offset)
                held.add(offset)
            progress.processed(offset)
            for gone in [o for o in held if rnd.random() < 0.2]:
                progress.release(gone)
                held.discard(gone)
            saved = progress.saved()
            assert saved is not None
            end = max(progress.position or 0, position)
            expected = held | {o for o in last if o >= (progress.position or 0)}
            assert saved == SavedProgress.holding(saved.watermark, end, expected)
            assert SavedProgress.decode(saved.encode()) == saved
