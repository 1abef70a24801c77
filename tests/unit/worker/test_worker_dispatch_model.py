"""A randomized model of the dispatcher: random enqueues, pops, releases, timer ticks, share
changes and revocations over two job types and two tenants with random caps and rates, checking
after each step that

- every limit's count of running jobs is the number of jobs holding its slot (running, admitted,
  or waiting for their type while holding their tenant's), and no cap is exceeded (but by a
  share that shrank under jobs already running);
- a limit with jobs waiting and a token to give has a timer armed or is due;
- no job is popped twice or after its partition was revoked, and a key's jobs start one at a
  time in offset order;

and at the end that everything drains. (A tenant's rate is not checked here: jobs that passed
their tenant's gate and then waited for their type start as their type allows, which may be
faster than the tenant's rate for a moment; docs/tenants.md says so.)
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from pipeline import Job, JobType
from pipeline_worker._metrics import TypeStats
from pipeline_worker._work import PartitionState, Work
from pipeline_worker.dispatch.dispatcher import Dispatcher
from pipeline_worker.dispatch.limits import TypeLimit, Waitlist
from pipeline_worker.dispatch.policies import StrictPolicy, WeightedPolicy
from pipeline_worker.dispatch.waitlists import remove_where

from .support import FakeTimers, noop, state

JOB_TYPE = JobType("t", noop)
SEEDS = 25
STEPS = 300


def listed(waiting: Waitlist[Work]) -> list[Work]:
    """The jobs of a waiting list, left in place (nothing is condemned)."""
    seen: list[Work] = []

    def note(work: Work) -> bool:
        seen.append(work)
        return False

    remove_where(waiting, note)
    return seen


class Model:
    def __init__(self, rng: random.Random, *, fair: bool, keys: bool, strict: bool) -> None:
        self.rng = rng
        self.timers = FakeTimers()
        self.running: list[Work] = []
        self.concurrency = rng.choice([1, 2, 4, 8])
        self.d = Dispatcher(
            4,
            StrictPolicy([10, 5, 3, 1]) if strict else WeightedPolicy([10, 5, 3, 1]),
            key_ordering=keys,
            clock=self.timers.clock,
            schedule=self.timers.schedule,
            on_ready=lambda: None,
            fairness=(lambda t: 2.0 if t == "A" else 1.0) if fair else None,
            room=lambda: self.concurrency - len(self.running),
        )
        self.keys = keys
        self.types = [self.limit(f"type{i}", tenant=False) for i in range(2)]
        self.tenants = {t: self.limit(f"tenant {t}", tenant=True) for t in ("A", "B")}
        self.limits = [*self.types, *self.tenants.values()]
        self.states = [state(pidx=p, partition=i) for p in range(4) for i in range(2)]
        self.offsets: dict[PartitionState, int] = defaultdict(int)
        self.made: list[Work] = []
        self.popped: set[int] = set()
        self.dropped: set[int] = set()
        self.last_of_key: dict[tuple[int, bytes], int] = {}
        self.allowed: dict[str, int] = {}

    def limit(self, name: str, *, tenant: bool) -> TypeLimit[Work]:
        rng = self.rng
        if tenant:
            cap = rng.choice([None, 1, 2, 4])
            rate = rng.choice([None, 10.0]) if cap is not None else 10.0
        else:
            cap = rng.choice([None, 1, 2, 3])
            rate = rng.choice([None, 5.0, 20.0]) if cap is not None else rng.choice([5.0, 20.0])
        limit = TypeLimit[Work](name, cap=cap, rate_limit=rate, now=0.0, fleet_cap=tenant)
        limit.set_share(1, 1, 0.0)
        return limit

    def enqueue(self) -> None:
        rng = self.rng
        p = rng.choice(self.states)
        for _ in range(rng.randint(1, 5)):
            offset = self.offsets[p]
            self.offsets[p] = offset + 1
            tenant = rng.choice(["A", "B", "C", None])
            job_id = f"{p.topic}-{p.partition}-{offset}"
            job = Job(id=job_id, type="t", payload=b"{}", tenant=tenant)
            p.tracker.add(offset)
            key = rng.choice([None, b"k1", b"k2", b"k3"])
            limit = rng.choice([None, *self.types])
            work = Work(p, offset, key, job, JOB_TYPE, limit, TypeStats("t", "default"))
            work.tenant_limit = self.tenants.get(tenant or "")
            self.made.append(work)
            self.d.queues[p.pidx].append(work)

    def take(self) -> None:
        free = self.concurrency - len(self.running)
        if free <= 0:
            return
        d = self.d
        taken = d.pop_many(free) if self.rng.random() < 0.5 else [w for w in [d.pop()] if w]
        for work in taken:
            assert id(work) not in self.popped, "popped twice"
            assert id(work) not in self.dropped, "popped after its partition was revoked"
            self.popped.add(id(work))
            if self.keys and work.key is not None:
                slot = (id(work.state), work.key)
                assert self.last_of_key.get(slot, -1) < work.offset, ("key order", slot)
                self.last_of_key[slot] = work.offset
            self.running.append(work)

    def finish(self) -> None:
        if self.running:
            self.d.release(self.running.pop(self.rng.randrange(len(self.running))))

    def reshare(self) -> None:
        owned, now = self.rng.randint(1, 4), self.timers.clock()
        for limit in self.limits:
            limit.set_share(owned, 4, now)
            if limit.cap is not None:
                self.allowed[limit.name] = max(limit.cap, limit.running)
        self.d.refresh_limits(self.limits)

    def revoke(self) -> None:
        p = self.rng.choice(self.states)
        self.dropped.update(id(work) for work in self.d.drop([p]))
        self.states[self.states.index(p)] = state(pidx=p.pidx, partition=p.partition + 10)

    def holders(self, limit: TypeLimit[Work]) -> int:
        """The jobs holding ``limit``'s slot: those holding all theirs, and those waiting for
        their type's limit, which hold their tenant's."""
        holding = [*self.running, *self.d.admitted]
        waiting_for_type: list[Work] = []
        for other in self.limits:
            waiting_for_type += [w for w in listed(other.waiting) if w.limit is other]
        return sum(1 for w in holding if limit in (w.limit, w.tenant_limit)) + sum(
            1 for w in waiting_for_type if w.tenant_limit is limit
        )

    def check(self) -> None:
        due = self.d._due  # the limits the next pop drains first
        for limit in self.limits:
            assert limit.running == self.holders(limit), limit.name
            if limit.cap is not None:
                allowed = max(limit.cap, self.allowed.get(limit.name, 0))
                assert limit.running <= allowed, (limit.name, limit.running, allowed)
                self.allowed[limit.name] = min(allowed, max(limit.cap, limit.running))
            bucket = limit.bucket
            if limit.waiting and not limit.capped and limit not in due:
                assert bucket is not None, (limit.name, "waits with a free slot and no rate")
                if bucket.rate > 0:  # its timer starts them when the rate allows
                    assert limit.timer is not None, (limit.name, "no timer")
        if self.keys:
            running = [(id(w.state), w.key) for w in self.running if w.key is not None]
            assert len(running) == len(set(running)), "two runs of one key"

    def drain(self) -> None:
        now = self.timers.clock()
        for limit in self.limits:
            limit.set_share(1, 1, now)
        self.d.refresh_limits(self.limits)
        for _ in range(20_000):
            while self.running:
                self.d.release(self.running.pop())
            self.take()
            if len(self.popped) + len(self.dropped) == len(self.made):
                break
            self.timers.advance(0.05)
        left = [w for w in self.made if id(w) not in self.popped | self.dropped]
        assert not left, (len(left), left[:3])
        while self.running:
            self.d.release(self.running.pop())
        for limit in self.limits:
            assert (limit.running, len(limit.waiting)) == (0, 0), limit.name
        assert not any(p.keys for p in self.states)


@pytest.mark.parametrize("seed", range(SEEDS))
@pytest.mark.parametrize("fair", [False, True], ids=["in-order", "fair"])
@pytest.mark.parametrize("keys", [False, True], ids=["unkeyed", "keyed"])
@pytest.mark.parametrize("strict", [False, True], ids=["weighted", "strict"])
def test_the_dispatcher_keeps_its_limits_and_drains(
    seed: int, fair: bool, keys: bool, strict: bool
) -> None:
    rng = random.Random(seed)
    model = Model(rng, fair=fair, keys=keys, strict=strict)
    for _ in range(STEPS):
        r = rng.random()
        if r < 0.35:
            model.enqueue()
        elif r < 0.6:
            model.take()
        elif r < 0.8:
            model.finish()
        elif r < 0.9:
            model.timers.advance(rng.choice([0.01, 0.05, 0.2]))
        elif r < 0.95:
            model.reshare()
        else:
            model.revoke()
        model.check()
    model.drain()
