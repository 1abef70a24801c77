"""Per-key ordering, per-type concurrency caps and fleet-wide rate limits."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import pytest

from pipeline import Priority

from .apps.recording import CONCURRENCY_CAP_ENV, RATE_LIMIT_ENV
from .harness import (
    RunEvent,
    check_ran,
    describe_group,
    enqueue,
    wait_joined,
    wait_until,
)
from .scenarios import max_overlap

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka


def test_jobs_with_the_same_key_run_in_offset_order_and_never_overlap(kit: WorkerKit) -> None:
    keys = [f"key-{i}" for i in range(20)]
    ids = [
        kit.producer.enqueue("ordered", {"n": n, "max_ms": 5.0}, key=key, priority="default")
        for n in range(100)
        for key in keys  # interleaved: every partition holds several keys, mixed
    ]
    kit.producer.flush(60)
    worker = kit.workers.start("--key-ordering", "--concurrency", "50", "--burst")
    assert worker.wait(timeout=120) == 0, worker.log_tail()
    assert check_ran(kit.recording, ids, exactly_once=True) == []

    by_key: dict[str, list[RunEvent]] = defaultdict(list)
    for event in kit.recording.events:
        by_key[event.key].append(event)
    assert sorted(by_key) == sorted(keys)
    for key, events in by_key.items():
        # File order is write order: for one key it must read S E S E ... in job order.
        kinds = "".join(e.kind for e in events)
        assert kinds == "SE" * 100, f"{key}: runs overlapped: {kinds[:60]}..."
        starts = [e for e in events if e.kind == "S"]
        assert [e.n for e in starts] == list(range(100)), f"{key}: ran out of order"
        offsets_seen = [e.offset for e in starts]
        assert offsets_seen == sorted(offsets_seen), f"{key}: not in offset order"
        assert all(e.job_id == f.job_id for e, f in zip(events[::2], events[1::2], strict=True))
    # The ordering held under concurrency: jobs of different keys did run at the same time,
    # also within one partition.
    assert max_overlap(kit.recording.events, by_partition=True) >= 2
    assert kit.offsets.lag([kit.topics.jobs(Priority.DEFAULT)]) == {}


def test_concurrency_cap_of_a_job_type_holds_while_other_jobs_use_the_slack(kit: WorkerKit) -> None:
    capped = enqueue(kit.producer, "capped", 300, fields={"max_ms": 20.0}, priority="default")
    others = enqueue(
        kit.producer, "sleepy_async", 600, first=1000, fields={"max_ms": 20.0}, priority="default"
    )
    worker = kit.workers.start("--concurrency", "30", "--burst", env={CONCURRENCY_CAP_ENV: "3"})
    assert worker.wait(timeout=120) == 0, worker.log_tail()
    assert check_ran(kit.recording, capped + others, exactly_once=True) == []
    capped_events = [e for e in kit.recording.events if e.job_type == "capped"]
    assert max_overlap(capped_events) == 3, "the cap was exceeded, or never reached"
    assert max_overlap(kit.recording.events) > 3, "other jobs did not use the free slots"


RATE = 200.0


@pytest.mark.slow  # 15 s of a measured rate; the token bucket's unit tests run by default
def test_rate_limit_holds_within_10_percent_across_two_workers(kit: WorkerKit) -> None:
    env = {RATE_LIMIT_ENV: str(RATE)}
    pair = [kit.workers.start("--concurrency", "20", env=env) for _ in range(2)]
    # Both are members, and the partitions shared, before the first job exists.
    wait_joined(kit.settings, kit.offsets.group, pair)
    # One job type lives on one priority topic, as types do: the fleet's rate must not depend
    # on how the assignor spread that topic's partitions over the two workers.
    ids = enqueue(kit.producer, "limited", 2400, priority="default")  # ~12 s at the limit
    wait_until(
        lambda: kit.recording.all_finished(ids),
        timeout=120,
        what=lambda: f"{len(ids)} limited jobs to run ({kit.recording.count('E')} so far)",
        watch=pair,
        interval=0.2,
    )
    group = describe_group(kit.settings, kit.offsets.group)
    for worker in pair:
        worker.terminate()
    assert [worker.wait(timeout=60) for worker in pair] == [0, 0]
    assert check_ran(kit.recording, ids, exactly_once=True) == []
    assert group.clients == {w.client_id for w in pair}, f"a rebalance happened: {group}"

    starts = sorted(kit.recording.starts(), key=lambda e: e.time_ns)
    # The window skips the first second (a limiter may start with a burst) and lasts 6 s; the
    # backlog must outlast it, or the rate measured would be the backlog's.
    opens = starts[0].time_ns + 1_000_000_000
    closes = opens + 6_000_000_000
    assert starts[-1].time_ns > closes, "the backlog ran out before the window closed"
    window = [e for e in starts if opens <= e.time_ns < closes]
    rate = len(window) / 6.0
    by_worker = {w.client_id: sum(1 for e in window if e.pid == w.pid) / 6.0 for w in pair}
    assert abs(rate - RATE) <= 0.1 * RATE, (
        f"{rate:.1f} jobs/s against a limit of {RATE:g}/s (per worker: {by_worker})"
    )
