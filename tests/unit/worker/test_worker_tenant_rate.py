"""A tenant's rate limit counts starts: a job that passed its tenant's gate and then waited for its
type's limit takes its tenant's token when it starts, not when it began to wait. Taken early,
the tokens of every job that waited there were spent at once when the type freed, and they all
started together, far over the tenant's rate."""

from __future__ import annotations

from pipeline_worker._work import Work
from pipeline_worker.dispatch.dispatcher import Dispatcher
from pipeline_worker.dispatch.limits import TypeLimit

from .support import FakeTimers, Jobs, state
from .test_worker_dispatch import dispatcher, enqueue


def limits(tenant_rate: float, type_cap: int) -> tuple[TypeLimit[Work], TypeLimit[Work]]:
    tenant = TypeLimit[Work]("tenant acme", cap=None, rate_limit=tenant_rate, now=0.0)
    tenant.set_share(1, 1, 0.0)
    capped = TypeLimit[Work]("report", cap=type_cap, rate_limit=None, now=0.0)
    return tenant, capped


def queue(d: Dispatcher, jobs: Jobs, count: int, *limits: TypeLimit[Work]) -> list[Work]:
    tenant, capped = limits
    p = state()
    works = [jobs.work(p, "report", limit=capped) for _ in range(count)]
    for work in works:
        work.tenant_limit = tenant
        enqueue(d, work)
    return works


def run_instantly(d: Dispatcher) -> int:
    """Start what may start and finish it at once, until nothing more may start: how many ran
    in this instant."""
    ran = 0
    while taken := d.pop_many(64):
        for work in taken:
            d.release(work)
        ran += len(taken)
    return ran


def test_jobs_that_waited_for_their_type_start_at_their_tenants_rate() -> None:
    timers = FakeTimers()
    d = dispatcher(timers=timers)
    tenant, capped = limits(tenant_rate=8.0, type_cap=2)
    works = queue(d, Jobs(), 40, tenant, capped)
    long_ones = d.pop_many(64)
    assert long_ones == works[:1]  # the tenant's one token (a bucket of 0.1 s, at least 1)
    timers.advance(0.125)
    long_ones += d.pop_many(64)
    assert long_ones == works[:2]  # the type's cap is full now
    for _ in range(24):  # 3 s of the long jobs: the tenant's timer passes jobs to the type
        timers.advance(0.125)
        assert d.pop_many(64) == []
    for work in long_ones:
        d.release(work)
    # The type frees both slots: its waiting jobs start as the tenant's tokens allow (one
    # saved up), not all of those that waited.
    assert run_instantly(d) == 1
    started = 0
    for _ in range(8):
        timers.advance(0.125)
        started += run_instantly(d)
    assert started == 8


def other_type(d: Dispatcher, jobs: Jobs, tenant: TypeLimit[Work]) -> Work:
    """A job of the tenant whose type has no limit."""
    (work,) = queue(d, jobs, 1, tenant, TypeLimit[Work]("other", cap=None, rate_limit=None, now=0))
    return work


def wait_for_token(d: Dispatcher, timers: FakeTimers, jobs: Jobs) -> tuple[TypeLimit[Work], ...]:
    """The second job of a capped type passes its tenant's gate while the first runs, then the
    tenant's token goes to a job of another type; the first ends: the type admits the second,
    with no tenant token left."""
    tenant, capped = limits(tenant_rate=1.0, type_cap=1)
    first, _ = queue(d, jobs, 2, tenant, capped)
    assert d.pop() is first
    timers.advance(1.0)  # the tenant's token passes the second to wait for its type
    assert d.pop() is None
    assert len(capped.waiting) == 1
    other = other_type(d, jobs, tenant)
    assert d.pop() is other  # the token was given back when the second began to wait
    d.release(other)
    d.release(first)
    return tenant, capped


def test_a_job_waiting_for_its_tenants_token_keeps_its_slots_and_goes_first() -> None:
    """Admitted by its type with no tenant token left, a job keeps the type's slot and waits
    for the tenant's next token ahead of the tenant's newer jobs: it is not sent back to wait
    for its type again, where others could take the slot each time."""
    timers = FakeTimers()
    d = dispatcher(timers=timers)
    jobs = Jobs()
    tenant, capped = wait_for_token(d, timers, jobs)
    assert d.pop() is None
    assert capped.running == 1  # it holds both slots while it waits
    assert tenant.running == 1
    later = other_type(d, jobs, tenant)
    assert d.pop() is None
    timers.advance(1.0)
    second = d.pop()
    assert second is not None
    assert second.limit is capped  # the token is its own, not the newer job's
    assert d.pop() is None
    timers.advance(1.0)
    assert d.pop() is later


def test_a_revoked_job_waiting_for_its_tenants_token_gives_back_its_slots() -> None:
    timers = FakeTimers()
    d = dispatcher(timers=timers)
    tenant, capped = wait_for_token(d, timers, Jobs())
    assert d.pop() is None  # the second holds the type's slot and waits for a token
    (second,) = tenant.owed
    assert d.drop([second.state]) == [second]
    assert capped.running == 0
    assert tenant.running == 0
    timers.advance(5.0)
    assert d.pop() is None
