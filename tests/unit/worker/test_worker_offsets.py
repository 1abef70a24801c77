"""The commit point never passes an unfinished offset, whatever order jobs finish in."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_worker.commit.offsets import OffsetTracker


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    """Increasing offsets with gaps (control records), and an order to finish them in."""
    gaps = draw(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=200))
    start = draw(st.integers(min_value=0, max_value=10**12))
    offsets = []
    offset = start
    for gap in gaps:
        offsets.append(offset)
        offset += gap
    order = draw(st.permutations(offsets))
    return offsets, list(order)


@given(deliveries())
def test_watermark_is_the_lowest_unfinished_offset(case: tuple[list[int], list[int]]) -> None:
    offsets, order = case
    tracker = OffsetTracker()
    for offset in offsets:
        tracker.add(offset)
    unfinished = set(offsets)
    for offset in order:
        returned = tracker.finish(offset)
        unfinished.discard(offset)
        watermark = tracker.watermark
        assert watermark is not None
        assert returned == watermark, "finish answers the watermark it leaves"
        if unfinished:
            assert watermark == min(unfinished)
            assert all(o not in unfinished for o in offsets if o < watermark)
        assert len(tracker) == len(unfinished)
    assert tracker.watermark == offsets[-1] + 1
    assert len(tracker) == 0


@given(deliveries())
def test_interleaved_adds_and_finishes(case: tuple[list[int], list[int]]) -> None:
    """Jobs finish while later offsets are still being delivered."""
    offsets, order = case
    tracker = OffsetTracker()
    delivered: set[int] = set()
    finished: set[int] = set()
    position = 0
    for offset in order:
        while offset not in delivered:
            tracker.add(offsets[position])
            delivered.add(offsets[position])
            position += 1
        tracker.finish(offset)
        finished.add(offset)
        watermark = tracker.watermark
        assert watermark is not None
        pending = delivered - finished
        expected = min(pending) if pending else max(delivered) + 1
        assert watermark == expected


def test_nothing_to_commit_before_the_first_offset() -> None:
    tracker = OffsetTracker()
    assert tracker.watermark is None
    tracker.add(41)
    assert tracker.watermark == 41
    tracker.finish(41)
    assert tracker.watermark == 42


def test_finishing_twice_or_below_the_watermark_changes_nothing() -> None:
    tracker = OffsetTracker()
    for offset in (5, 6, 7):
        tracker.add(offset)
    tracker.finish(5)
    tracker.finish(5)
    tracker.finish(4)
    assert tracker.watermark == 6
    tracker.finish(7)
    tracker.finish(7)
    assert len(tracker) == 1
    tracker.finish(6)
    assert tracker.watermark == 8
    assert len(tracker) == 0


def test_offsets_must_be_added_in_order() -> None:
    tracker = OffsetTracker()
    tracker.add(10)
    with pytest.raises(ValueError, match="added after"):
        tracker.add(10)
