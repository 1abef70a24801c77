"""A tenant's rate limit and its type's cap together: a rate-limited tenant's backlog holds back
no other tenant's jobs of the type, and a job that waited for its type keeps its place ahead of
its tenant's newer jobs. (Both held under a first version of taking the tenant's token when a
job starts, rather than when it passes its tenant's gate: they guard any next one. The token
taken at the gate lets jobs that waited for their type start faster than the tenant's rate for
a moment: docs/tenants.md.)"""

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


def queue(
    d: Dispatcher, jobs: Jobs, count: int, capped: TypeLimit[Work], tenant: TypeLimit[Work] | None
) -> list[Work]:
    p = state()
    works = [jobs.work(p, "report", limit=capped) for _ in range(count)]
    for work in works:
        work.tenant_limit = tenant
        enqueue(d, work)
    return works


def run_instantly(d: Dispatcher) -> list[Work]:
    """Start what may start and finish it at once, until nothing more may start: what ran in
    this instant."""
    ran: list[Work] = []
    while taken := d.pop_many(64):
        for work in taken:
            d.release(work)
        ran += taken
    return ran


def test_a_rate_limited_tenant_holds_back_no_other_tenant_of_its_type() -> None:
    """The type's slots go to the jobs that may start: those of a tenant without a rate limit
    do not wait behind a rate-limited tenant's backlog (a version that kept the type's slot for
    a job waiting for its tenant's token let that backlog hold every slot of the type)."""
    timers = FakeTimers()
    d = dispatcher(timers=timers)
    tenant, capped = limits(tenant_rate=1.0, type_cap=2)
    jobs = Jobs()
    flood = queue(d, jobs, 20, capped, tenant)
    first = d.pop_many(64)
    assert first == flood[:1]
    others = queue(d, jobs, 10, capped, None)
    assert run_instantly(d) == others  # one slot free all along: none of them waits
    d.release(first[0])
    timers.advance(1.0)
    assert run_instantly(d) == flood[1:2]  # the tenant's next token, a second later


def test_a_job_waiting_for_its_tenants_token_keeps_its_place() -> None:
    timers = FakeTimers()
    d = dispatcher(timers=timers)
    tenant, capped = limits(tenant_rate=1.0, type_cap=1)
    jobs = Jobs()
    [first] = queue(d, jobs, 1, capped, tenant)
    assert d.pop() is first
    [second] = queue(d, jobs, 1, capped, tenant)
    timers.advance(1.0)  # the tenant's token passes it on to wait for its type
    assert d.pop() is None
    timers.advance(0.5)
    [third] = queue(d, jobs, 1, capped, tenant)
    assert d.pop() is None
    d.release(first)
    assert d.pop() is second  # ahead of the newer job
    d.release(second)
    assert d.pop() is None  # the third's token comes a second after the second's
    timers.advance(1.0)
    assert d.pop() is third
