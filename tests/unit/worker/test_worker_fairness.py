"""Fair dispatch across tenants: deficit round robin inside a priority, tenant limits."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from pydantic import ValidationError

from pipeline import Job, JobType, Pipeline
from pipeline._settings import Settings
from pipeline._tenantsettings import TenantSettings
from pipeline._workersettings import WorkerSettings
from pipeline.testing import InMemoryTransport
from pipeline_worker._metrics import TypeStats, WorkerMetrics
from pipeline_worker._metricsexport import make_registry
from pipeline_worker._work import PartitionState, Work
from pipeline_worker.dispatch.dispatcher import Dispatcher
from pipeline_worker.dispatch.fair import FairQueue
from pipeline_worker.dispatch.limits import TypeLimit, fleet_cap_share
from pipeline_worker.dispatch.policies import StrictPolicy, WeightedPolicy
from pipeline_worker.dispatch.tenants import TenantTable

from ..metrics_exported import gauges
from .support import FakeTimers, Harness, noop, state

JOB_TYPE = JobType("t", noop)


class Feed:
    """Work items of given tenants with increasing offsets per partition."""

    def __init__(self) -> None:
        self._offsets: dict[PartitionState, int] = {}

    def work(
        self,
        partition: PartitionState,
        tenant: str | None,
        *,
        key: bytes | None = None,
        limit: TypeLimit[Work] | None = None,
    ) -> Work:
        offset = self._offsets.get(partition, 0)
        self._offsets[partition] = offset + 1
        job = Job(id=f"{tenant}-{partition.partition}-{offset}", type="t", payload=b"{}",
                  tenant=tenant)  # fmt: skip
        partition.tracker.add(offset)
        return Work(partition, offset, key, job, JOB_TYPE, limit, TypeStats("t", "default"))

    def many(
        self,
        partition: PartitionState,
        tenant: str | None,
        count: int,
        *,
        limit: TypeLimit[Work] | None = None,
        tenant_limit: TypeLimit[Work] | None = None,
    ) -> list[Work]:
        works = [self.work(partition, tenant, limit=limit) for _ in range(count)]
        for work in works:
            work.tenant_limit = tenant_limit
        return works


def equal(_: str | None) -> float:
    return 1.0


def tenants_of(works: list[Work]) -> str:
    return "".join(w.job.tenant or "-" for w in works)


def test_a_flood_does_not_delay_a_later_tenant_beyond_a_round_each() -> None:
    queue = FairQueue(equal, key_ordering=False)
    feed = Feed()
    p = state()
    queue.extend(feed.many(p, "A", 10_000))
    queue.extend(feed.many(p, "B", 100))
    order = queue.take(300)
    b_positions = [i for i, w in enumerate(order) if w.job.tenant == "B"]
    assert len(b_positions) == 100
    # Each of B's jobs starts within one turn of A's: the 100th by the 200th start.
    assert b_positions[-1] < 200, b_positions
    assert tenants_of(order[:10]) == "ABABABABAB"
    # The same flood without fairness: B waits for all of A.
    plain = [*feed.many(p, "A", 10_000), *feed.many(p, "B", 100)]
    assert next(i for i, w in enumerate(plain) if w.job.tenant == "B") == 10_000


def test_each_tenant_keeps_its_offset_order() -> None:
    queue = FairQueue(equal, key_ordering=False)
    feed = Feed()
    p, q = state(partition=0), state(partition=1)
    for _ in range(50):
        queue.extend([feed.work(p, "A"), feed.work(q, "B"), feed.work(p, "B"), feed.work(q, "A")])
    order = queue.take(1000)
    assert len(order) == 200
    assert not queue
    for tenant in "AB":
        for partition in (p, q):
            offsets = [w.offset for w in order if w.job.tenant == tenant and w.state is partition]
            assert offsets == sorted(offsets)


@pytest.mark.parametrize(("weights", "shares"), [((3.0, 1.0), (3, 1)), ((0.5, 1.0), (1, 2))])
def test_starts_follow_the_weights_while_both_wait(
    weights: tuple[float, float], shares: tuple[int, int]
) -> None:
    table = {"A": weights[0], "B": weights[1]}
    queue = FairQueue(lambda tenant: table[tenant or ""], key_ordering=False)
    feed = Feed()
    p = state()
    queue.extend(feed.many(p, "A", 5000))
    queue.extend(feed.many(p, "B", 5000))
    unit = sum(shares) * 100
    counts = Counter(w.job.tenant for w in queue.take(unit * 10))
    assert counts == {"A": shares[0] * 1000, "B": shares[1] * 1000}
    # One at a time gives the same turns as batches.
    one_by_one = FairQueue(lambda tenant: table[tenant or ""], key_ordering=False)
    one_by_one.extend(feed.many(p, "A", 50))
    one_by_one.extend(feed.many(p, "B", 50))
    again = FairQueue(lambda tenant: table[tenant or ""], key_ordering=False)
    again.extend(feed.many(p, "A", 50))
    again.extend(feed.many(p, "B", 50))
    assert tenants_of([one_by_one.popleft() for _ in range(40)]) == tenants_of(again.take(40))


def test_an_idle_tenant_saves_no_credit_and_a_lone_one_earns_none() -> None:
    queue = FairQueue(equal, key_ordering=False)
    feed = Feed()
    p = state()
    queue.extend(feed.many(p, "A", 1000))
    assert len(queue.take(900)) == 900  # A alone: it ran as fast as it could
    queue.extend(feed.many(p, "B", 10))
    # A's 900 starts alone left it no debt, B's absence no credit: they alternate at once.
    assert tenants_of(queue.take(6)) == "ABABAB"


def test_lanes_live_only_while_their_tenant_has_jobs_held() -> None:
    queue = FairQueue(equal, key_ordering=False)
    feed = Feed()
    p = state()
    for n in range(1000):
        queue.append(feed.work(p, f"tenant-{n}"))  # a thousand names, one job each
        assert queue.lanes <= len(queue)
    assert queue.lanes == 1000
    assert len(queue.take(1000)) == 1000
    assert queue.lanes == 0
    assert len(queue) == 0
    assert not queue
    with pytest.raises(IndexError):
        queue.popleft()


def test_jobs_of_one_key_leave_in_offset_order_whatever_their_tenants() -> None:
    queue = FairQueue(equal, key_ordering=True)
    feed = Feed()
    p = state()
    # Key k's jobs alternate tenants, behind a flood of A: B's lane would serve them early.
    queue.extend(feed.many(p, "A", 20))
    keyed = [feed.work(p, "AB"[n % 2], key=b"k") for n in range(10)]
    queue.extend(keyed)
    queue.extend(feed.many(p, "B", 5))
    order = queue.take(100)
    k_offsets = [w.offset for w in order if w.key == b"k"]
    assert k_offsets == sorted(k_offsets) == [w.offset for w in keyed]
    assert queue.lanes == 0


def test_removing_a_partition_keeps_the_rest_in_order() -> None:
    queue = FairQueue(equal, key_ordering=True)
    feed = Feed()
    p, q = state(partition=0), state(partition=1)
    queue.extend([feed.work(p, "A", key=b"k"), feed.work(q, "A", key=b"k"), feed.work(q, "B")])
    queue.extend([feed.work(p, "B", key=b"k"), feed.work(q, "A")])
    removed = queue.remove_where(lambda w: w.state is p)
    assert [(w.state, w.offset) for w in removed] == [(p, 0), (p, 1)]
    assert len(queue) == 3
    order = queue.take(10)
    assert [(w.job.tenant, w.offset) for w in order] == [("A", 0), ("B", 1), ("A", 2)]
    assert queue.lanes == 0


def dispatcher(timers: FakeTimers) -> Dispatcher:
    return Dispatcher(
        4,
        StrictPolicy([10, 5, 3, 1]),
        key_ordering=False,
        clock=timers.clock,
        schedule=timers.schedule,
        on_ready=lambda: None,
        fairness=equal,
    )


def setup() -> tuple[FakeTimers, Dispatcher, Feed, PartitionState]:
    timers = FakeTimers()
    return timers, dispatcher(timers), Feed(), state()


def tenant_limit(cap: int | None = None, rate: float | None = None) -> TypeLimit[Work]:
    limit = TypeLimit[Work]("tenant A", cap=cap, rate_limit=rate, now=0.0, fleet_cap=True)
    limit.set_share(1, 1, 0.0)
    return limit


def test_a_capped_tenant_waits_aside_while_the_others_use_the_slots() -> None:
    _timers, d, feed, p = setup()
    cap = tenant_limit(cap=2)
    d.queues[0].extend(feed.many(p, "A", 10, tenant_limit=cap))
    d.queues[0].extend(feed.many(p, "B", 10))
    first = d.pop_many(8)
    assert tenants_of(first) == "ABABBBBB"
    assert cap.running == 2
    assert cap.waiting
    d.release(first[0])  # an A job ended: the next A job is admitted
    assert tenants_of(d.pop_many(8)) == "ABBBB"


def test_a_job_waiting_for_its_type_holds_its_tenant_slot_and_drop_frees_both() -> None:
    _timers, d, feed, p = setup()
    cap = tenant_limit(cap=3)
    by_type = TypeLimit[Work]("t", cap=1, rate_limit=None, now=0.0)
    d.queues[0].extend(feed.many(p, "A", 4, limit=by_type, tenant_limit=cap))
    started = d.pop_many(4)
    assert len(started) == 1
    assert (cap.running, len(cap.waiting)) == (3, 1)  # two wait for the type with A's slots
    assert (by_type.running, len(by_type.waiting)) == (1, 2)
    dropped = d.drop([p])
    assert len(dropped) == 3
    assert cap.running == 1
    assert by_type.running == 1
    d.release(started[0])
    assert cap.running == 0
    assert by_type.running == 0


def test_a_tenant_rate_releases_its_jobs_on_the_timer() -> None:
    timers, d, feed, p = setup()
    rate = tenant_limit(rate=10.0)
    d.queues[0].extend(feed.many(p, "A", 5, tenant_limit=rate))
    assert len(d.pop_many(5)) == 1  # one token to start with
    admitted = 0
    for _ in range(4):
        timers.advance(0.15)  # a token each time (the bucket holds one at most)
        admitted += len(d.pop_many(5))
    assert admitted == 4


SHARES = [(10, 6, 12, 5), (10, 7, 12, 5), (10, 5, 12, 4), (10, 12, 12, 10), (2, 1, 12, 1)]
SHARES.append((10, 0, 12, 0))


@pytest.mark.parametrize(
    ("cap", "owned", "total", "share"),
    SHARES,
)
def test_a_fleet_cap_is_shared_by_partitions_rounding_down_to_at_least_one(
    cap: int, owned: int, total: int, share: int
) -> None:
    assert fleet_cap_share(cap, owned, total) == share


def test_the_table_names_listed_tenants_and_counts_the_rest_as_other() -> None:
    settings = TenantSettings.model_validate(
        {"named": {"acme": {"weight": 3, "concurrency": 4, "rate_limit": 50}, "zed": {}}}
    )
    metrics = WorkerMetrics()
    table = TenantTable(settings, metrics)
    assert sorted(metrics.tenants) == ["acme", "other", "zed"]
    assert table.weight("acme") == 3.0
    assert table.weight("zed") == table.weight("x") == 1.0
    feed = Feed()
    p = state()
    works = [feed.work(p, t) for t in ("acme", "zed", "nobody", None)]
    table.tag(works)
    assert [w.tenant_stats.tenant for w in works if w.tenant_stats] == [
        "acme", "zed", "other", "other"
    ]  # fmt: skip
    acme = works[0].tenant_limit
    assert acme is not None
    assert works[1].tenant_limit is None
    table.set_share({"a": 3, "b": 3}, {"a": 6, "b": 6})
    assert acme.cap == 2
    assert acme.rate == 25.0
    assert not TenantTable(TenantSettings(), WorkerMetrics()).active


def test_tenant_settings_reject_bad_values_and_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValidationError):
        TenantSettings.model_validate({"named": {"other": {}}})
    with pytest.raises(ValidationError):
        TenantSettings.model_validate({"named": {"a": {"weight": 0}}})
    with pytest.raises(ValidationError):
        TenantSettings.model_validate({"default_weight": float("nan")})
    with pytest.raises(ValidationError):
        TenantSettings.model_validate({"named": {"a": {"concurrency": 0}}})
    assert WorkerSettings().tenants.fairness is True
    monkeypatch.setenv("PIPELINE_WORKER__TENANTS__FAIRNESS", "false")
    monkeypatch.setenv("PIPELINE_WORKER__TENANTS__NAMED", '{"acme": {"weight": 2.5}}')
    tenants = Settings().worker.tenants
    assert tenants.fairness is False
    assert tenants.weight_of("acme") == 2.5


def test_the_tenant_label_has_only_the_named_tenants_and_other() -> None:
    metrics = WorkerMetrics()
    table = TenantTable(TenantSettings.model_validate({"named": {"acme": {}}}), metrics)
    feed = Feed()
    p = state()
    works = [feed.work(p, f"tenant-{n % 50}") for n in range(200)]
    works += [feed.work(p, "acme") for _ in range(5)]
    table.tag(works)
    for work in works:
        assert work.tenant_stats is not None
        work.tenant_stats.started += 1
    registry = make_registry(metrics, gauges())
    started = {
        sample.labels["tenant"]: sample.value
        for family in registry.collect()
        if family.name == "pipeline_tenant_jobs_started"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert started == {"acme": 5.0, "other": 200.0}


def test_a_tenant_cap_holds_on_the_worker_and_its_slots_come_back_on_plain_successes() -> None:
    async def main() -> None:
        app = Pipeline(transport=InMemoryTransport())
        running: Counter[str] = Counter()
        most: Counter[str] = Counter()
        gate = asyncio.Event()
        full = asyncio.Event()

        @app.job("hold")
        async def hold(who: str) -> None:
            running[who] += 1
            most[who] = max(most[who], running[who])
            if running.total() == 7:
                full.set()
            await gate.wait()
            running[who] -= 1

        # No middleware: successes take the processor's inlined path, which must free the
        # tenant's slot as the dispatcher's release does.
        h = Harness(app, plain=True, tenants={"named": {"acme": {"concurrency": 2}}})
        h.processor.set_share({"t": 1}, {"t": 1})
        h.feed(
            *(h.message("hold", {"who": "acme"}, tenant="acme") for _ in range(10)),
            *(h.message("hold", {"who": "rest"}, tenant="someone") for _ in range(5)),
        )
        await full.wait()  # 2 of acme's and the 5 others
        assert most == {"acme": 2, "rest": 5}
        gate.set()
        # Idle once nothing runs: a freed slot starts the next queued job before that.
        assert await h.processor.wait_idle((), 10), f"{h.processor.in_flight} still running"
        assert h.processor.finished == 15
        assert most["acme"] == 2
        assert h.partition.commit_offset == 15
        limit = h.processor.tenants.entries["acme"].limit
        assert limit is not None
        assert limit.running == 0
        assert h.metrics.tenants["acme"].started == 10
        assert h.metrics.tenants["other"].started == 5

    asyncio.run(asyncio.wait_for(main(), 20))


def test_the_commit_point_never_passes_a_job_fairness_left_for_later() -> None:
    queue = FairQueue(equal, key_ordering=False)
    feed = Feed()
    p = state()
    queue.extend(feed.many(p, "A", 300))
    queue.extend(feed.many(p, "B", 30))  # offsets 300-329, started among A's first ones
    finished: set[int] = set()
    while queue:
        for work in queue.take(7):
            commit = p.tracker.finish(work.offset)
            finished.add(work.offset)
            unfinished = min(set(range(330)) - finished, default=330)
            assert commit == unfinished, f"commit point {commit}, lowest unfinished {unfinished}"
    assert p.tracker.watermark == 330


def test_priorities_keep_their_weights_and_tenants_share_inside_each() -> None:
    timers = FakeTimers()
    d = Dispatcher(
        4,
        WeightedPolicy([10, 5, 3, 1]),
        key_ordering=False,
        clock=timers.clock,
        schedule=timers.schedule,
        on_ready=lambda: None,
        fairness=equal,
    )
    feed = Feed()
    critical, high = state(0), state(1)
    d.queues[0].extend(feed.many(critical, "A", 3000))
    d.queues[0].extend(feed.many(critical, "B", 200))
    d.queues[1].extend(feed.many(high, "A", 3000))
    taken: list[Work] = []
    while len(taken) < 600:
        taken.extend(d.pop_many(64))
    by_priority = Counter(w.state.pidx for w in taken)
    assert abs(by_priority[0] - 2 * by_priority[1]) <= 10  # 10:5 while both have jobs
    in_critical = [w for w in taken if w.state.pidx == 0]
    b_share = sum(1 for w in in_critical if w.job.tenant == "B") / len(in_critical)
    assert 0.45 <= b_share <= 0.55  # B's 200 jobs get half of critical's starts
