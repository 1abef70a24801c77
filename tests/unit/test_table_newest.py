"""Which record of a key wins on a table topic of several partitions: partition 0's last record
(where a writer of this release writes), else the newest by timestamp of the other partitions'
last records (left by writers of earlier releases, when the key hashed there)."""

from __future__ import annotations

from pipeline._tablereader import Newest


def _fold(*records: tuple[str, bytes | None, int, int]) -> dict[str, bytes | None]:
    newest: Newest[bytes | None] = Newest()
    for key, value, partition, timestamp in records:
        newest.add(key, value, partition, timestamp)
    return newest.winners()


def test_the_last_record_of_partition_0_wins_whatever_the_timestamps_say() -> None:
    # Two writers whose clocks disagree: the later record of partition 0 is stamped earlier.
    assert _fold(("a", b"1", 0, 1_003), ("a", b"2", 0, 1_001)) == {"a": b"2"}
    # ... and the tombstones each write left in another partition, newer than that record.
    both = [
        ("a", b"1", 0, 1_003),
        ("a", None, 1, 1_002),
        ("a", b"2", 0, 1_001),
        ("a", None, 1, 1_000),
    ]
    assert _fold(*both) == {"a": b"2"}
    assert _fold(*reversed(both[:2]), *reversed(both[2:])) == {"a": b"2"}
    # On a topic stamped by the broker the tombstones, written after the record, are newer.
    assert _fold(("a", b"v", 0, 5_000), ("a", None, 1, 5_001)) == {"a": b"v"}


def test_a_key_partition_0_lacks_takes_the_newest_of_the_other_partitions_last_records() -> None:
    assert _fold(("a", b"old", 2, 1_000), ("a", b"new", 1, 2_000)) == {"a": b"new"}
    assert _fold(("a", b"new", 1, 2_000), ("a", b"old", 2, 1_000)) == {"a": b"new"}
    # Within a partition its last record stands for it, whatever its timestamp.
    assert _fold(("a", b"x", 1, 9_000), ("a", b"y", 1, 10), ("a", b"z", 2, 500)) == {"a": b"z"}


def test_a_removal_stays_once_compaction_took_partition_0_s_tombstone() -> None:
    # A removal left a tombstone in every partition; the cleaner removed partition 0's first.
    assert _fold(("a", b"stale", 2, 100), ("a", None, 2, 5_000), ("a", None, 1, 5_000)) == {
        "a": None
    }


def test_the_winner_is_known_after_each_record() -> None:
    newest: Newest[str] = Newest()
    assert newest.add("a", "legacy", 2, 100) == "legacy"
    assert newest.add("a", "put", 0, 50) == "put"
    assert newest.add("a", "shadow", 1, 49) == "put"
    assert newest.winners() == {"a": "put"}
