"""Any writer can put anything on ``<ns>.scheduler-state``: a record of another shape is
skipped with a log line, never crashes a takeover, and never costs memory the record asks for."""

from __future__ import annotations

import logging

import pytest

from pipeline._cronstate import decode_cron_state, decode_last_fire, encode_last_fire
from pipeline._settings import Settings
from pipeline_scheduler import _state
from pipeline_scheduler._progress import SavedProgress
from pipeline_scheduler._state import load_state, progress_key

GOOD = SavedProgress.holding(10, 20, (10, 15))

BAD_PROGRESS = [
    b'{"v":2,"w":1e400,"p":20,"r":[]}',
    b'{"v":2,"w":10,"p":1e400,"r":[]}',
    b'{"v":2,"w":10,"p":20,"r":[0,1e400]}',
    b'{"v":2,"w":true,"p":20,"r":[]}',
    b'{"v":2,"w":10,"p":20,"r":[0,1.5]}',
    b'{"v":2,"w":-1,"p":20,"r":[]}',
    b'{"v":2,"w":10,"p":5,"r":[]}',  # the position below the watermark
    b'{"v":2,"w":10,"p":20,"r":[0,11]}',  # a held offset at or beyond the position
    b'{"v":2,"w":10,"p":20,"r":[0,-3]}',
    b'{"v":2,"w":10,"p":20,"r":[0]}',
    b'{"v":2,"w":10,"p":20,"r":{"a":1}}',
    b'{"v":1,"w":10,"p":20,"h":[1e400]}',
    b'{"v":1,"w":10,"p":20,"h":[-2]}',
    b'{"w":10,"p":20}',
    b"[" * 100_000,
    b"\xff\xfe",
    b"7",
]


@pytest.mark.parametrize("data", BAD_PROGRESS, ids=range(len(BAD_PROGRESS)))
def test_a_bad_progress_record_raises_value_error_only(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a progress record"):
        SavedProgress.decode(data)


def test_a_huge_run_length_is_refused_before_it_is_expanded() -> None:
    # Expanded, this run would be 9e18 offsets: the decoder must refuse it, not allocate it.
    data = b'{"v":2,"w":0,"p":9223372036854775807,"r":[0,9000000000000000000]}'
    with pytest.raises(ValueError, match="held offsets"):
        SavedProgress.decode(data)


def test_a_record_naming_more_held_offsets_than_the_bound_is_refused() -> None:
    from pipeline_scheduler._progress import MAX_HELD

    data = b'{"v":2,"w":0,"p":10000000,"r":[0,%d]}' % (MAX_HELD + 1)
    with pytest.raises(ValueError, match="held offsets"):
        SavedProgress.decode(data)
    at_the_bound = SavedProgress.decode(b'{"v":2,"w":0,"p":10000000,"r":[0,%d]}' % MAX_HELD)
    assert len(at_the_bound.held) == MAX_HELD


@pytest.mark.parametrize(
    "data",
    [
        b'{"last":1e400}',
        b'{"last":true}',
        b'{"last":"5"}',
        b'{"last":1e20}',
        b"[1]",
        b"[" * 100_000,
        b'{"last":5,"until":5}',  # a catch-up ends after the last fire
        b'{"last":5,"until":"9"}',
        b'{"last":5,"until":true}',
        b'{"last":5,"until":1e20}',
    ],
)
def test_a_bad_last_fire_record_raises_value_error_only(data: bytes) -> None:
    with pytest.raises(ValueError, match="not a last-fire record"):
        decode_last_fire(data)


def test_a_last_fire_record_round_trips() -> None:
    assert decode_last_fire(encode_last_fire(1_700_000_000_000)) == 1_700_000_000_000
    assert decode_cron_state(encode_last_fire(1_000)) == (1_000, None)
    # A catch-up that goes on at the next step; readers of the last fire alone ignore it.
    assert decode_cron_state(encode_last_fire(1_000, 9_000)) == (1_000, 9_000)
    assert decode_last_fire(encode_last_fire(1_000, 9_000)) == 1_000


def test_load_state_skips_bad_records_and_keeps_every_other(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    records: list[tuple[str, bytes | None]] = [
        (progress_key("ns.deferred", 0).decode(), GOOD.encode()),
        # A bad record after a good one of the same key: the good one stands.
        (progress_key("ns.deferred", 0).decode(), b'{"v":2,"w":1e400,"p":0,"r":[]}'),
        (progress_key("ns.deferred", 1).decode(), b'{"v":2,"w":0,"p":1e400,"r":[]}'),
        (progress_key("ns.deferred", 2).decode(), b'{"v":2,"w":0,"p":99,"r":[0,1e400]}'),
        (
            progress_key("ns.deferred.0", 0).decode(),
            b'{"v":2,"w":0,"p":9223372036854775807,"r":[0,9000000000000000000]}',
        ),
        (progress_key("ns.deferred", 3).decode(), b"[" * 100_000),
        ("cron:nightly", encode_last_fire(1_000)),
        ("cron:broken", b'{"v":1,"last":1e400}'),
        ("cron:hourly", encode_last_fire(2_000)),
        ("offsets:ns.deferred:" + "9" * 5000, GOOD.encode()),
        # A key no scheduler writes: it was passed over silently (docs/scheduler.md says it is
        # skipped and counted at every takeover); its tombstone is the way out, not counted.
        ("weird:key", b"{}"),
        ("gone:key", None),
    ]
    monkeypatch.setattr(_state, "read_table", lambda *args, **kwargs: records)
    with caplog.at_level(logging.WARNING, logger="pipeline.scheduler"):
        state = load_state(Settings(namespace="ns"))
    assert state.progress == {("ns.deferred", 0): GOOD}
    assert state.last_fires == {"nightly": 1_000, "hourly": 2_000}
    skipped = [r for r in caplog.records if "scheduler state record skipped" in r.getMessage()]
    assert len(skipped) == 8
    assert state.skipped == 8
    assert "no scheduler writes this key" in skipped[-1].getMessage()
