"""Fairness across tenants inside a priority, and per-tenant caps and rates across two workers.

The recording does not name tenants; each test knows which job ids it enqueued for which.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from .harness import check_ran, describe_group, enqueue, wait_joined, wait_until
from .scenarios import max_overlap

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

FLOOD = 5000
LATE = 100
JOB = {"min_ms": 4.0, "max_ms": 8.0}
"""~6 ms a job at concurrency 10: the flood takes ~3 s to run, far longer than it takes to read
it (6 partitions of 2,000 jobs of look-ahead hold all of it)."""


@pytest.mark.parametrize("fairness", [True, False], ids=["fair", "read-order"])
def test_a_flood_of_one_tenant_does_not_hold_back_a_later_tenant(
    kit: WorkerKit, fairness: bool
) -> None:
    flood = enqueue(kit.producer, "sleepy_async", FLOOD, fields=JOB, tenant="A")
    late = enqueue(kit.producer, "sleepy_async", LATE, first=FLOOD, fields=JOB, tenant="B")
    env = {"PIPELINE_WORKER__TENANTS__FAIRNESS": str(fairness).lower()}
    worker = kit.workers.start("--concurrency", "10", "--priorities", "default", "--burst", env=env)
    assert worker.wait(timeout=180) == 0, worker.log_tail()
    assert check_ran(kit.recording, flood + late, exactly_once=True) == []

    # File order is start order. How far had the flood got when B's last job started?
    order = [e.job_id for e in kit.recording.events if e.kind == "S"]
    late_ids = set(late)
    last_late = max(i for i, job_id in enumerate(order) if job_id in late_ids)
    flood_started = last_late + 1 - LATE
    if fairness:
        # B is read within the first few hundred starts and then gets every other start: all
        # of it runs before half the flood has (without fairness, after nearly all of it).
        assert flood_started < FLOOD // 2, f"B's last job started after {flood_started} of A's"
    else:
        assert flood_started >= FLOOD // 2, f"read order, yet B ended after {flood_started} of A"


def test_jobs_of_one_key_keep_their_order_when_their_tenants_differ(kit: WorkerKit) -> None:
    # Each key's jobs alternate between tenants A and B, behind a flood of A's: B's lane is
    # short and A's long, so B's turns would start a key's odd jobs before its even ones.
    flood = enqueue(kit.producer, "sleepy_async", 1000, first=10_000, fields=JOB, tenant="A")
    keys = [f"key-{i}" for i in range(10)]
    ids = [
        kit.producer.enqueue(
            "ordered", {"n": n, "max_ms": 3.0}, key=key, tenant="AB"[n % 2], priority="default"
        )
        for n in range(30)
        for key in keys
    ]
    kit.producer.flush(60)
    worker = kit.workers.start("--key-ordering", "--concurrency", "20", "--burst")
    assert worker.wait(timeout=120) == 0, worker.log_tail()
    assert check_ran(kit.recording, flood + ids, exactly_once=True) == []
    for key in keys:
        events = [e for e in kit.recording.events if e.key == key]
        assert "".join(e.kind for e in events) == "SE" * 30, f"{key}: runs overlapped"
        assert [e.n for e in events if e.kind == "S"] == list(range(30)), f"{key}: out of order"


CAP = 12
"""Fleet-wide: 6 partitions split 3/3 or 4/2 give shares that add up to 12 (6+6 or 8+4)."""
RATE = 150.0


@pytest.mark.slow
def test_a_tenants_cap_and_rate_hold_within_10_percent_across_two_workers(
    kit: WorkerKit,
) -> None:
    named = {"capped": {"concurrency": CAP}, "limited": {"rate_limit": RATE}}
    env = {"PIPELINE_WORKER__TENANTS__NAMED": json.dumps(named)}
    pair = [kit.workers.start("--concurrency", "40", env=env) for _ in range(2)]
    wait_joined(kit.settings, kit.offsets.group, pair)
    # Both tenants at once, on one priority; jobs of a third, unnamed tenant use the slack.
    capped = enqueue(
        kit.producer, "sleepy_async", 900, fields={"min_ms": 20, "max_ms": 40}, tenant="capped"
    )  # ~2.3 s at the cap
    limited = enqueue(kit.producer, "noop", 1500, first=1000, tenant="limited")  # ~10 s
    free = enqueue(kit.producer, "noop", 500, first=5000, tenant="someone")
    ids = capped + limited + free
    wait_until(
        lambda: kit.recording.all_finished(ids),
        timeout=120,
        what=lambda: f"{len(ids)} jobs to run ({kit.recording.count('E')} so far)",
        watch=pair,
        interval=0.2,
    )
    group = describe_group(kit.settings, kit.offsets.group)
    for worker in pair:
        worker.terminate()
    assert [worker.wait(timeout=60) for worker in pair] == [0, 0]
    assert check_ran(kit.recording, ids, exactly_once=True) == []
    assert group.clients == {w.client_id for w in pair}, f"a rebalance happened: {group}"

    events = kit.recording.events
    capped_ids = set(capped)
    # Concurrency from the start and end lines of both workers' runs, in write order.
    overlap = max_overlap(e for e in events if e.job_id in capped_ids)
    assert CAP * 0.9 <= overlap <= CAP * 1.1, f"{overlap} of capped's jobs ran at once (cap {CAP})"
    free_ids = set(free)
    assert max(e.time_ns for e in events if e.job_id in free_ids) < max(
        e.time_ns for e in events if e.job_id in capped_ids
    ), "the unnamed tenant waited for the capped one"

    limited_ids = set(limited)
    starts = sorted(e.time_ns for e in events if e.kind == "S" and e.job_id in limited_ids)
    # A window of 6 s after the first second (a bucket may start with a burst), inside the
    # backlog's ~10 s.
    opens = starts[0] + 1_000_000_000
    closes = opens + 6_000_000_000
    assert starts[-1] > closes, "the backlog ran out before the window closed"
    rate = sum(1 for t in starts if opens <= t < closes) / 6.0
    assert abs(rate - RATE) <= 0.1 * RATE, f"{rate:.1f} jobs/s against a limit of {RATE:g}/s"
