"""Due-time heap, tier selection and partition progress: the scheduler's pure parts."""

from __future__ import annotations

import pytest

from pipeline._schedulersettings import SchedulerSettings
from pipeline_scheduler._duequeue import DueQueue
from pipeline_scheduler._progress import PartitionProgress, SavedProgress
from pipeline_scheduler._routing import HOLD, RELEASE, Router

S = 1000
ROUTER = Router(120 * S, (60 * S, 600 * S, 3600 * S, 21600 * S))


def push(queue: DueQueue, due: int, offset: int) -> None:
    queue.push(due, ("t", 0), offset, "jobs", None, b"v", None, f"id{offset}")


def test_heap_pops_due_jobs_soonest_first_and_ties_in_arrival_order() -> None:
    queue = DueQueue()
    for offset, due in enumerate([500, 100, 300, 100, 900]):
        push(queue, due, offset)
    assert queue.next_due() == 100
    assert [j.offset for j in queue.pop_due(300, 10)] == [1, 3, 2]
    assert queue.next_due() == 500  # the wake-up time moves to the next job
    push(queue, 200, 9)  # an earlier job arriving later wakes the loop sooner
    assert queue.next_due() == 200
    assert queue.pop_due(199, 10) == []
    assert [j.offset for j in queue.pop_due(10_000, 2)] == [9, 0]
    assert len(queue) == 1


@pytest.mark.parametrize(
    ("remaining_s", "expected"),
    [
        (-5, RELEASE),
        (0, RELEASE),
        (0.001, HOLD),
        (120, HOLD),
        (121, 0),  # 121 - 60 = 61 >= 60 s tier
        (659, 0),  # 659 - 60 = 599: the 600 s tier does not fit yet
        (660, 1),
        (3660, 2),
        (21660, 3),
        (86400, 3),
    ],
)
def test_tier_is_the_largest_that_returns_the_job_half_a_horizon_early(
    remaining_s: float, expected: int
) -> None:
    now = 1_000_000
    assert ROUTER.route(now + int(remaining_s * S), now) == expected


def test_every_job_beyond_the_horizon_fits_a_tier_and_comes_back_before_due() -> None:
    for remaining in range(120 * S + 1, 30_000 * S, 997 * S):
        tier = ROUTER.route(remaining, 0)
        assert tier >= 0
        assert ROUTER.tiers_ms[tier] <= remaining - 60 * S


def test_settings_refuse_tiers_that_leave_a_gap_beyond_the_horizon() -> None:
    with pytest.raises(ValueError, match="at most half the horizon"):
        SchedulerSettings(horizon_s=60, wait_tiers_s=[60, 600])
    with pytest.raises(ValueError, match="strictly increasing"):
        SchedulerSettings(wait_tiers_s=[600, 60])


def test_watermark_is_the_lowest_held_offset() -> None:
    progress = PartitionProgress(committed=10)
    assert progress.watermark == 10
    for offset in range(10, 15):
        progress.delivered(offset)
        if offset in (11, 13):
            progress.hold(offset)
        progress.processed(offset)
    assert progress.watermark == 11
    progress.release(13)
    assert progress.watermark == 11
    progress.release(11)
    assert progress.watermark == 15
    assert progress.held_count == 0


def test_saved_progress_round_trips_and_drives_the_replay() -> None:
    progress = PartitionProgress(committed=100)
    for offset in range(100, 110):
        progress.delivered(offset)
        if offset in (102, 107):
            progress.hold(offset)
        progress.processed(offset)
    saved = progress.saved()
    assert saved == SavedProgress.holding(102, 110, (102, 107))
    assert SavedProgress.decode(saved.encode()) == saved

    # A new leader starts at the committed watermark and skips what was finished above it.
    replay = PartitionProgress(committed=102, saved=saved)
    finished = [o for o in range(102, 112) if replay.finished_before(o)]
    assert finished == [103, 104, 105, 106, 108, 109]
    # A record that does not match the committed offset is not trusted.
    assert not PartitionProgress(committed=90, saved=saved).finished_before(103)


@pytest.mark.parametrize(
    "held",
    [(), (5,), (5, 6, 7), (5, 6, 9, 10, 11, 40), tuple(range(5, 600_005)), (5, 7, 9, 11)],
    ids=["none", "one", "a-run", "runs", "half-a-million-in-a-row", "every-other"],
)
def test_saved_progress_survives_its_round_trip_and_stays_small(held: tuple[int, ...]) -> None:
    saved = SavedProgress.holding(5, 700_000, held)
    data = saved.encode()
    assert SavedProgress.decode(data) == saved
    # Kafka refuses a record over 1 MB: runs of consecutive offsets cost a few bytes each.
    assert len(data) < 100


def test_saved_progress_of_the_first_format_is_read() -> None:
    data = b'{"v":1,"w":100,"p":120,"h":[2,5,1]}'
    assert SavedProgress.decode(data) == SavedProgress.holding(100, 120, (102, 107, 108))


def test_a_lead_releases_that_long_before_due_and_no_earlier() -> None:
    led = Router(120 * S, (60 * S,), lead_ms=200)
    assert led.route(due_ms=10_000, now_ms=9_799) == HOLD
    assert led.route(due_ms=10_000, now_ms=9_800) == RELEASE
    assert ROUTER.route(due_ms=10_000, now_ms=9_800) == HOLD
