"""Priority policies, per-key ordering and per-type limits of the dispatcher."""

from __future__ import annotations

from collections import Counter, deque

import pytest

from pipeline_worker._work import Work
from pipeline_worker.dispatch.dispatcher import Dispatcher
from pipeline_worker.dispatch.limits import TypeLimit
from pipeline_worker.dispatch.policies import StrictPolicy, WeightedPolicy, make_policy

from .support import FakeTimers, Jobs, state


def enqueue(d: Dispatcher, work: Work) -> None:
    """What the processor does with a decoded job: it joins the queue of its priority."""
    d.queues[work.state.pidx].append(work)


def dispatcher(
    policy: StrictPolicy | WeightedPolicy | None = None,
    *,
    key_ordering: bool = False,
    timers: FakeTimers | None = None,
    ready: list[int] | None = None,
) -> Dispatcher:
    timers = timers or FakeTimers()
    return Dispatcher(
        4,
        policy or StrictPolicy([10, 5, 3, 1]),
        key_ordering=key_ordering,
        clock=timers.clock,
        schedule=timers.schedule,
        on_ready=lambda: ready.append(1) if ready is not None else None,
    )


def fill(d: Dispatcher, jobs: Jobs, pidx: int, count: int) -> None:
    partition = state(pidx)
    for _ in range(count):
        enqueue(d, jobs.work(partition))


def drain(d: Dispatcher, count: int) -> list[Work]:
    taken = []
    for _ in range(count):
        work = d.pop()
        assert work is not None
        taken.append(work)
        d.release(work)
    return taken


def test_weighted_shares_follow_the_weights_over_a_long_run() -> None:
    d = dispatcher(WeightedPolicy([10, 5, 3, 1]))
    jobs = Jobs()
    for pidx in range(4):
        fill(d, jobs, pidx, 20_000)
    picks = Counter(w.state.pidx for w in drain(d, 19_000))
    assert picks == {0: 10_000, 1: 5_000, 2: 3_000, 3: 1_000}


def test_weighted_interleaves_instead_of_bursting() -> None:
    d = dispatcher(WeightedPolicy([10, 5, 3, 1]))
    jobs = Jobs()
    for pidx in range(4):
        fill(d, jobs, pidx, 100)
    window = [w.state.pidx for w in drain(d, 19)]
    assert Counter(window) == {0: 10, 1: 5, 2: 3, 3: 1}
    longest_run = max(len(run) for run in "".join(map(str, window)).split("1"))
    assert longest_run <= 3  # critical never takes 10 in a row: others get turns in between


def test_weighted_never_starves_low_and_shares_only_among_non_empty_queues() -> None:
    d = dispatcher(WeightedPolicy([10, 5, 3, 1]))
    jobs = Jobs()
    fill(d, jobs, 0, 10_000)
    fill(d, jobs, 3, 10_000)
    picks = Counter(w.state.pidx for w in drain(d, 1_100))
    assert picks == {0: 1_000, 3: 100}


def test_weighted_with_custom_weights_within_a_percent() -> None:
    d = dispatcher(make_policy("weighted", [7, 1, 1, 3]))
    jobs = Jobs()
    for pidx in range(4):
        fill(d, jobs, pidx, 10_000)
    picks = Counter(w.state.pidx for w in drain(d, 12_000))
    for pidx, weight in enumerate([7, 1, 1, 3]):
        assert picks[pidx] == pytest.approx(12_000 * weight / 12, rel=0.01)


def test_strict_runs_lower_priorities_only_when_higher_ones_are_empty() -> None:
    d = dispatcher(make_policy("strict", [10, 5, 3, 1]))
    jobs = Jobs()
    fill(d, jobs, 3, 5)
    fill(d, jobs, 0, 5)
    fill(d, jobs, 1, 2)
    order = [w.state.pidx for w in drain(d, 12)]
    assert order == [0] * 5 + [1] * 2 + [3] * 5
    assert d.pop() is None


def test_an_empty_dispatcher_has_nothing() -> None:
    assert dispatcher(WeightedPolicy([1, 1, 1, 1])).pop() is None
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fifo", [1, 1, 1, 1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        WeightedPolicy([1, 0, 1, 1])


def test_same_key_jobs_never_run_together_and_run_in_offset_order() -> None:
    d = dispatcher(key_ordering=True)
    jobs = Jobs()
    partition = state(0)
    a1, b1, a2, a3, b2 = (jobs.work(partition, key=k) for k in (b"a", b"b", b"a", b"a", b"b"))
    for work in (a1, b1, a2, a3, b2):
        enqueue(d, work)
    running = [d.pop(), d.pop()]
    assert running == [a1, b1]  # a2 waits behind a1, b2 behind b1
    assert d.pop() is None
    d.release(b1)
    assert d.pop() is b2
    d.release(a1)
    assert d.pop() is a2
    assert d.pop() is None
    d.release(a2)
    assert d.pop() is a3
    d.release(a3)
    d.release(b2)
    assert partition.keys == {}


def test_without_key_ordering_keys_are_ignored() -> None:
    d = dispatcher(key_ordering=False)
    jobs = Jobs()
    partition = state(0)
    first, second = jobs.work(partition, key=b"k"), jobs.work(partition, key=b"k")
    enqueue(d, first)
    enqueue(d, second)
    assert [d.pop(), d.pop()] == [first, second]


def test_keyless_jobs_are_never_ordered() -> None:
    d = dispatcher(key_ordering=True)
    jobs = Jobs()
    partition = state(0)
    for _ in range(3):
        enqueue(d, jobs.work(partition))
    assert all(d.pop() is not None for _ in range(3))


def test_a_capped_type_waits_aside_without_blocking_other_types() -> None:
    d = dispatcher()
    jobs = Jobs()
    limit = TypeLimit[Work]("slow", cap=2, rate_limit=None, now=0.0)
    partition = state(0)
    slow = [jobs.work(partition, "slow", limit=limit) for _ in range(4)]
    fast = [jobs.work(partition, "fast") for _ in range(3)]
    for work in slow + fast:
        enqueue(d, work)
    started = [d.pop() for _ in range(5)]
    assert started == [slow[0], slow[1], *fast]
    assert d.pop() is None
    assert limit.running == 2
    assert len(limit.waiting) == 2
    d.release(slow[0])
    assert d.pop() is slow[2]  # admitted as soon as a slot frees, in arrival order
    assert d.pop() is None
    d.release(slow[1])
    assert d.pop() is slow[3]
    assert limit.running == 2


def test_a_freed_slot_of_a_capped_type_goes_to_a_critical_job_before_earlier_low_ones() -> None:
    d = dispatcher()
    jobs = Jobs()
    limit = TypeLimit[Work]("capped", cap=1, rate_limit=None, now=0.0)
    low = [jobs.work(state(3), "capped", limit=limit) for _ in range(3)]
    for work in low:
        enqueue(d, work)
    assert d.pop() is low[0]
    assert d.pop() is None  # low[1:] wait in the limit
    critical = jobs.work(state(0), "capped", limit=limit)
    enqueue(d, critical)
    assert d.pop() is None  # waits too, but ahead of the low jobs that came first
    d.release(low[0])
    assert drain(d, 3) == [critical, low[1], low[2]]
    assert not limit.waiting


def test_a_capped_types_waiting_jobs_follow_the_weighted_shares() -> None:
    d = dispatcher(WeightedPolicy([3, 1, 1, 1]))
    jobs = Jobs()
    limit = TypeLimit[Work]("capped", cap=1, rate_limit=None, now=0.0)
    low = [jobs.work(state(3), "capped", limit=limit) for _ in range(8)]
    for work in low:
        enqueue(d, work)
    first = d.pop()
    assert first is low[0]
    assert d.pop() is None  # 7 low jobs wait in the limit
    for _ in range(8):
        enqueue(d, jobs.work(state(0), "capped", limit=limit))
    assert d.pop() is None  # and 8 critical ones after them
    d.release(first)
    started = drain(d, 8)
    # The weights decide among the waiting jobs as among the queues: 3 critical to 1 low.
    assert Counter(w.state.pidx for w in started) == {0: 6, 3: 2}


def test_a_low_job_holding_its_tenants_slot_in_a_capped_type_is_not_starved_under_strict() -> None:
    """A job waiting for its type's cap holds its tenant's slot: starved there by another
    tenant's stream of critical jobs of the type, a low job would hold back every job of its
    tenant, of any type and priority."""
    d = dispatcher()  # strict
    jobs = Jobs()
    capped = TypeLimit[Work]("T", cap=1, rate_limit=None, now=0.0)
    tenant_a = TypeLimit[Work]("tenant a", cap=1, rate_limit=None, now=0.0)

    def add(pidx: int, job_type: str, limit: TypeLimit[Work] | None, tenant: bool) -> Work:
        work = jobs.work(state(pidx), job_type, limit=limit)
        work.tenant_limit = tenant_a if tenant else None
        enqueue(d, work)
        return work

    running = [add(0, "T", capped, False)]
    assert d.pop() is running[0]  # tenant b's critical job of T runs
    for _ in range(3):
        add(0, "T", capped, False)  # more of them wait for T
    assert d.pop() is None
    a_low = add(3, "T", capped, True)  # a's low job takes a's slot and waits for T
    assert d.pop() is None
    a_critical = add(0, "U", None, True)  # a's critical job of an uncapped type waits for a's
    assert d.pop() is None
    started: list[Work] = []
    for _ in range(20):  # b sends one more critical job of T each time one ends
        add(0, "T", capped, False)
        d.release(running.pop())
        while (work := d.pop()) is not None:
            started.append(work)
            if work.limit is capped:
                running.append(work)
            else:
                d.release(work)
    assert a_low in started
    assert a_critical in started


def test_a_key_successor_still_respects_its_type_cap() -> None:
    d = dispatcher(key_ordering=True)
    jobs = Jobs()
    limit = TypeLimit[Work]("capped", cap=1, rate_limit=None, now=0.0)
    partition = state(0)
    first = jobs.work(partition, "capped", key=b"k", limit=limit)
    other = jobs.work(partition, "capped", key=b"x", limit=limit)
    second = jobs.work(partition, "capped", key=b"k", limit=limit)
    for work in (first, other, second):
        enqueue(d, work)
    assert d.pop() is first
    assert d.pop() is None  # other waits in the limit, second behind its key
    d.release(first)
    assert d.pop() is other  # the limit's queue comes first; second then queues for the limit
    assert d.pop() is None
    d.release(other)
    assert d.pop() is second


def test_a_rate_limited_type_is_admitted_by_a_timer_at_its_rate() -> None:
    timers = FakeTimers()
    ready: list[int] = []
    d = dispatcher(timers=timers, ready=ready)
    jobs = Jobs()
    limit = TypeLimit[Work]("limited", cap=None, rate_limit=10.0, now=0.0)
    limit.set_share(1, 1, 0.0)
    partition = state(0)
    for _ in range(5):
        enqueue(d, jobs.work(partition, "limited", limit=limit))
    assert d.pop() is not None  # the bucket starts with one token
    assert d.pop() is None
    assert len(timers.timers) == 1  # one timer, no spinning
    timers.advance(0.1)
    assert ready == [1]
    assert d.pop() is not None
    assert d.pop() is None
    started = 2
    for _ in range(30):
        timers.advance(0.1)
        while d.pop() is not None:
            started += 1
    assert started == 5


def test_dropping_a_partition_removes_its_jobs_everywhere_and_frees_slots() -> None:
    d = dispatcher(key_ordering=True)
    jobs = Jobs()
    limit = TypeLimit[Work]("capped", cap=1, rate_limit=None, now=0.0)
    gone, kept = state(0, partition=0), state(0, partition=1)
    running = jobs.work(gone, "capped", key=b"k", limit=limit)
    waiting_key = jobs.work(gone, "x", key=b"k")
    waiting_gate = jobs.work(kept, "capped", limit=limit)
    queued = jobs.work(gone, "x")
    other = jobs.work(kept, "x")
    for work in (running, waiting_key, waiting_gate):
        enqueue(d, work)
    assert d.pop() is running
    assert d.pop() is None  # waiting_key behind its key, waiting_gate in the limit
    enqueue(d, queued)
    enqueue(d, other)
    dropped = d.drop([gone])
    assert set(dropped) == {waiting_key, queued}
    assert gone.keys == {}
    d.release(running)  # finishing after the drop admits the other partition's job
    assert d.pop() is waiting_gate
    assert d.pop() is other
    assert d.pop() is None


def test_dropping_admitted_jobs_gives_their_gate_slot_back() -> None:
    d = dispatcher()
    jobs = Jobs()
    limit = TypeLimit[Work]("capped", cap=1, rate_limit=None, now=0.0)
    partition = state(0)
    first, second = (
        jobs.work(partition, "capped", limit=limit),
        jobs.work(partition, "capped", limit=limit),
    )
    enqueue(d, first)
    enqueue(d, second)
    assert d.pop() is first
    assert d.pop() is None  # second waits in the limit
    d.release(first)  # second is admitted (holds the slot) but not started
    assert d.admitted == deque([second])
    assert limit.running == 1
    assert d.drop([partition]) == [second]
    assert limit.running == 0


def test_a_slot_given_back_by_a_drop_admits_a_job_of_another_partition_waiting_for_it() -> None:
    # Nothing else would: a job waiting on a cap has no timer, and no job of the capped type
    # may be running to release one.
    d = dispatcher()
    jobs = Jobs()
    limit = TypeLimit[Work]("capped", cap=1, rate_limit=None, now=0.0)
    gone, kept = state(0, partition=0), state(0, partition=1)
    first = jobs.work(gone, "capped", limit=limit)
    admitted = jobs.work(gone, "capped", limit=limit)
    waiting = jobs.work(kept, "capped", limit=limit)
    for work in (first, admitted, waiting):
        enqueue(d, work)
    assert d.pop() is first
    assert d.pop() is None  # the other two wait in the limit
    d.release(first)  # the next is admitted (holds the slot), not started
    assert d.admitted == deque([admitted])
    assert d.drop([gone]) == [admitted]
    assert d.pop() is waiting


def test_taking_many_at_once_keeps_the_weighted_shares() -> None:
    d = dispatcher(WeightedPolicy([10, 5, 3, 1]))
    jobs = Jobs()
    for pidx in range(4):
        fill(d, jobs, pidx, 20_000)
    picks: Counter[int] = Counter()
    while sum(picks.values()) < 19_000:
        batch = d.pop_many(38)
        picks.update(w.state.pidx for w in batch)
        for work in batch:
            d.release(work)
    assert picks == {0: 10_000, 1: 5_000, 2: 3_000, 3: 1_000}


def test_taking_many_respects_gates_and_keys() -> None:
    for key_ordering in (False, True):
        d = dispatcher(key_ordering=key_ordering)
        jobs = Jobs()
        limit = TypeLimit[Work]("capped", cap=2, rate_limit=None, now=0.0)
        partition = state(1)
        capped = [jobs.work(partition, "capped", limit=limit) for _ in range(4)]
        keyed = [jobs.work(partition, key=b"k") for _ in range(2)]
        for work in capped + keyed:
            enqueue(d, work)
        taken = d.pop_many(100)
        expected = [*capped[:2], *keyed] if not key_ordering else [*capped[:2], keyed[0]]
        assert taken == expected
        assert d.pop_many(100) == []
        d.release(capped[0])
        assert d.pop_many(100) == [capped[2]]
