"""The finished-offset map of a commit's metadata: round trips, the shortest form, the size
bound, marks written by an older worker, and metadata that is not ours."""

from __future__ import annotations

import base64
import json
import random
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline_worker.commit import offsetmap
from pipeline_worker.commit.marks import CommitMark, fit, max_moved, promised
from pipeline_worker.commit.offsetmap import Runs, Skips


@st.composite
def finished_sets(draw: st.DrawFn) -> tuple[int, Runs]:
    """A commit point and some offsets at or above it."""
    base = draw(st.integers(min_value=0, max_value=10**12))
    gaps = draw(st.lists(st.integers(min_value=0, max_value=5000), max_size=300))
    offsets, at = [], base
    for gap in gaps:
        at += gap
        offsets.append(at)
    return base, offsetmap.runs_of(offsets)


@given(finished_sets())
def test_every_set_survives_its_round_trip(case: tuple[int, Runs]) -> None:
    base, runs = case
    text = offsetmap.encode(base, runs)
    assert offsetmap.decode(base, text) == runs
    assert json.dumps(text) == f'"{text}"', "it must sit in a JSON string unescaped"


@given(finished_sets(), st.lists(st.integers(min_value=1, max_value=10**6), max_size=20))
def test_a_mark_with_a_map_and_moves_survives_its_round_trip(
    case: tuple[int, Runs], gaps: list[int]
) -> None:
    base, runs = case
    moved, at = [], base
    for gap in gaps:
        at += gap
        moved.append(at)
    mark = CommitMark(base, tuple(moved), True, base + 2000, 1, base + 3, runs)
    assert CommitMark.decode(base, mark.encode()) == mark
    assert set(_offsets(mark.skips)) == set(_offsets(runs)) | set(moved)


def test_a_small_set_is_pinned_to_its_bytes() -> None:
    # 10 and 12 finished: run lengths 0,1,1,1 (4 bytes) lose to the bitset 0b101 (1 byte).
    assert offsetmap.encode(10, ((10, 11), (12, 13))) == "b" + base64.b85encode(b"\x05").decode()
    # Everything from 11 to 4999: a gap of 1, a run of 4,989 (two LEB128 bytes).
    assert offsetmap.encode(10, ((11, 5000),)) == "r" + base64.b85encode(b"\x01\xfd\x26").decode()
    assert CommitMark(10, finished=((11, 5000),)).encode() == '{"v":1,"o":10,"f":"r0sST"}'


@pytest.mark.parametrize(
    ("runs", "tag"),
    [
        (((101, 200_000),), "r"),  # one long run: a few bytes of run lengths
        (tuple((o, o + 1) for o in range(101, 200_000, 2)), "B"),  # regular: compressed
        (offsetmap.runs_of(o for o in range(100, 3000) if random.Random(o).random() < 0.5), "b"),
    ],
    ids=["one-run", "every-other", "scattered"],
)
def test_the_shortest_form_is_chosen(runs: Runs, tag: str) -> None:
    text = offsetmap.encode(100, runs)
    assert text[0] == tag
    raw = {
        "r": offsetmap._run_lengths(100, runs),
        "b": offsetmap._bitset(100, runs),
    }
    lengths = [len(b) for b in raw.values()]
    for data in raw.values():
        packer = zlib.compressobj(9, zlib.DEFLATED, -15)
        lengths.append(len(packer.compress(data) + packer.flush()))
    assert len(base64.b85decode(text[1:])) == min(lengths)
    assert offsetmap.decode(100, text) == runs


def test_a_mark_written_by_an_older_worker_still_skips_its_moves() -> None:
    """Marks of the first format (moved offsets only) decode as they always did."""
    old = '{"v":1,"m":[2,3],"d":1,"h":95,"s":1}'
    mark = CommitMark.decode(5, old)
    assert mark == CommitMark(5, (7, 10), dirty=True, high=100, strikes=1)
    assert mark.skips == ((7, 8), (10, 11))


def test_an_older_worker_reads_the_fields_it_knows() -> None:
    """The map is a key added to the same envelope: the version an older reader checks, and
    the moved list it skips, are unchanged."""
    record = json.loads(CommitMark(5, (7,), dirty=True, finished=((6, 9),)).encode())
    assert record["v"] == 1
    assert record["m"] == [2]
    assert record["d"] == 1


def _deflated(data: bytes) -> str:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return base64.b85encode(packer.compress(data) + packer.flush()).decode()


@pytest.mark.parametrize(
    "metadata",
    [
        '{"v":1,"f":5}',
        '{"v":1,"f":"x00"}',  # unknown form
        '{"v":1,"f":"r~~~~~"}',  # not base85 of anything
        '{"v":1,"f":"r' + base64.b85encode(b"\x80").decode() + '"}',  # a varint cut short
        '{"v":1,"f":"r' + base64.b85encode(b"\x01").decode() + '"}',  # a gap with no run
        '{"v":1,"f":"r' + base64.b85encode(b"\x00\x00").decode() + '"}',  # an empty run
        '{"v":1,"f":"R' + _deflated(b"\x00" * (offsetmap.MAX_RAW + 1)) + '"}',  # a bomb
        '{"v":1,"f":"B' + base64.b85encode(b"\x00\x01").decode() + '"}',  # not DEFLATE
        '{"v":1,"f":"b' + base64.b85encode(b"\xff" * (offsetmap.MAX_RAW + 1)).decode() + '"}',
        '{"v":2,"f":"b1p"}',
        '{"v":1,"h":1e999}',  # numbers JSON reads as infinity
        '{"v":1,"s":-1e999}',
        '{"v":1,"m":[1e999]}',
    ],
)
def test_a_map_that_is_not_ours_decodes_to_an_empty_mark(metadata: str) -> None:
    assert CommitMark.decode(3, metadata) == CommitMark(3)


def test_a_promise_that_is_not_a_number_of_ours_is_none() -> None:
    assert promised(3, '{"v":1,"h":1e999}') == -1


def test_a_map_too_large_for_the_limit_is_cut_at_the_highest_offset_that_fits() -> None:
    rng = random.Random(7)
    scattered = offsetmap.runs_of(o for o in range(101, 60_000) if rng.random() < 0.5)
    moved = tuple(range(70_000, 70_000 + max_moved(4096) * 1000, 1000))
    mark = CommitMark(100, moved, dirty=True, high=5000, finished=scattered)
    text, whole = fit(mark, 4096)
    assert not whole
    assert len(text) <= 4096
    cut = CommitMark.decode(100, text)
    assert cut.moved == moved, "moved offsets are never cut"
    assert (cut.dirty, cut.high) == (True, 5000)
    assert cut.finished, "as much of the map as fits"
    end = cut.finished[-1][1]
    assert cut.finished == offsetmap.clip(scattered, 100, end), "a prefix of the map"
    longer = offsetmap.clip(scattered, 100, end + 64)
    assert len(CommitMark(100, moved, True, 5000, finished=longer).encode()) > 4096


def test_a_map_that_fits_is_whole() -> None:
    mark = CommitMark(100, finished=((101, 1_000_000),))
    assert fit(mark, 1024) == (mark.encode(), True)


def test_skips_pass_over_each_finished_offset_once_in_order() -> None:
    skips = Skips(((5, 7), (9, 10)))
    assert [o for o in range(3, 12) if skips.covers(o)] == [5, 6, 9]
    assert skips.above(0) == ((5, 7), (9, 10)), "passed or not, they are finished"
    skips = Skips(((5, 7), (9, 10)))
    assert skips.covers(6)
    assert skips.above(6) == ((6, 7), (9, 10))
    assert skips.above(10) == ()


def _offsets(runs: Runs) -> list[int]:
    return [o for start, end in runs for o in range(start, end)]


@pytest.mark.parametrize(
    "mark",
    [
        CommitMark(7, dirty=True, high=2007, finished=((9, 5000),)),
        CommitMark(7),
        CommitMark(20, high=5),
    ],
)
def test_the_promise_of_a_mark_is_read_without_its_map(mark: CommitMark) -> None:
    assert promised(mark.offset, mark.encode()) == mark.high


def test_the_promise_of_metadata_that_is_not_ours_is_none() -> None:
    assert promised(3, "not json") == -1
    assert promised(3, '{"v":2,"h":4}') == -1
