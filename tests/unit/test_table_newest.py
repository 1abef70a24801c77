"""A table topic of several partitions: each key's winning record is the last of its partition
and, across partitions, the newest by timestamp."""

from __future__ import annotations

from pipeline._tablereader import newest


def test_the_last_record_of_a_partition_wins_whatever_its_timestamp() -> None:
    # Writers' clocks disagree: a later record of the same partition may be stamped earlier.
    assert newest([("a", b"1", 0, 500), ("a", b"2", 0, 100)]) == [("a", b"2")]


def test_across_partitions_the_newest_by_timestamp_wins_in_any_order_of_reading() -> None:
    old, new = ("a", b"old", 2, 1_000), ("a", None, 0, 2_000)
    assert newest([old, new]) == [("a", None)]
    assert newest([new, old]) == [("a", None)]  # the tombstone is newer: "a" stays removed
    # A put and the tombstones written a millisecond before it into the other partitions.
    put, shadow = ("b", b"v", 0, 5_000), ("b", None, 1, 4_999)
    assert newest([shadow, put]) == newest([put, shadow]) == [("b", b"v")]


def test_every_key_keeps_its_own_winner() -> None:
    read = [("a", b"1", 0, 10), ("b", b"x", 1, 5), ("a", b"2", 1, 20), ("c", None, 0, 1)]
    assert sorted(newest(read), key=lambda r: r[0]) == [("a", b"2"), ("b", b"x"), ("c", None)]
