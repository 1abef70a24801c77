"""Tenants and limits together: fairness through a limit that several tenants share."""

from __future__ import annotations

from pipeline_worker._work import Work
from pipeline_worker.dispatch.limits import TypeLimit, fleet_cap_share

from .support import FakeTimers, state
from .test_worker_fairness import Feed, dispatcher, tenants_of


def test_a_flood_set_aside_by_its_type_cap_lets_a_later_tenant_take_turns() -> None:
    """A type's cap is shared by every tenant: A's flood, set aside in one pass, used to start
    in full (99 jobs) before any of B's jobs read just after it."""
    timers = FakeTimers()
    d = dispatcher(timers)
    feed = Feed()
    p = state()
    by_type = TypeLimit[Work]("t", cap=1, rate_limit=None, now=0.0)
    d.queues[0].extend(feed.many(p, "A", 100, limit=by_type))
    running = d.pop_many(10)
    assert len(running) == 1  # the other 99 wait for the type's slot
    d.queues[0].extend(feed.many(p, "B", 5, limit=by_type))
    order: list[Work] = []
    for _ in range(12):
        for work in running:
            d.release(work)
        running = d.pop_many(10)
        assert len(running) == 1  # the cap holds, and a slot freed is used
        order.extend(running)
    # The first A is admitted by the release, before B's jobs join the waiting ones.
    assert tenants_of(order) == "AABABABABABA"
    b_offsets = [w.offset for w in order if w.job.tenant == "B"]
    assert b_offsets == list(range(100, 105))  # B's own order holds


def test_a_rate_limited_type_admits_tenants_by_their_turns() -> None:
    timers = FakeTimers()
    d = dispatcher(timers)
    feed = Feed()
    p = state()
    by_type = TypeLimit[Work]("t", cap=None, rate_limit=10.0, now=0.0)
    by_type.set_share(1, 1, 0.0)
    d.queues[0].extend(feed.many(p, "A", 50, limit=by_type))
    order = d.pop_many(100)  # the one token there is
    d.queues[0].extend(feed.many(p, "B", 3, limit=by_type))
    for _ in range(50):  # bounded: a limit that admits nothing more fails, not hangs
        if len(order) >= 9:
            break
        timers.advance(0.1)  # a token, and the timer that admits a job with it
        order.extend(d.pop_many(100))
    # A token a tenth of a second: B's jobs start within 0.8 s, not after A's 5 s.
    assert tenants_of(order) == "AAABABABA"
    assert len(by_type.waiting) == 50 - 6


def test_an_uneven_assignment_can_take_the_fleet_over_a_tenant_cap() -> None:
    """docs/tenants.md's example: each share rounds down, but never below 1 while a worker owns
    a partition, so the fleet may run over the cap even with no more workers than the cap."""
    shares = [fleet_cap_share(3, owned, 12) for owned in (10, 1, 1)]
    assert shares == [2, 1, 1]
    assert sum(shares) == 4
    even = [fleet_cap_share(3, owned, 12) for owned in (4, 4, 4)]
    assert sum(even) == 3
