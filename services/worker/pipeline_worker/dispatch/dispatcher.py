"""Which buffered job runs next: the priority policy, per-key ordering and the limits.

Jobs wait in one queue per priority. :meth:`Dispatcher.pop` picks a queue by the policy
(``strict``: the first non-empty queue in priority order; ``weighted``: smooth weighted
round-robin over the non-empty queues, so a low priority is never starved), then checks the
job's limits. Inside a queue, jobs leave in the order they were read, or, with tenant fairness,
by deficit round robin over their tenants (:mod:`.fair`). A job that cannot start yet is set
aside, never spun on: behind the running job of its key (per-key ordering), or in its tenant's
limit, then its type's (concurrency cap or rate limit; a job waiting in its type's limit holds
its tenant's slot). When the blocking job finishes (:meth:`Dispatcher.release`) or the rate
allows (a timer), the job set aside moves on to the ``admitted`` queue, which :meth:`pop`
serves first; the jobs waiting for a limit leave it by the priorities' weights
(:mod:`.waitlists`). With tenant fairness, the jobs waiting for a limit leave it by their tenants'
turns too: a limit shared by tenants (a type's) would otherwise start one tenant's whole flood,
set aside in one pass, before another tenant's jobs read just after it.

A limit's waiting jobs take their slots and tokens only when a concurrency slot is free for them
(``room``): with every slot taken, a timer or a freed slot of the limit just marks the limit
*due*, and the next :meth:`pop` (the processor pops whenever slots free) admits its jobs first.
A timer that moved jobs to ``admitted`` with no slot to run them would spend the rate on them,
and they would all start at once when slots free: a burst far over the bucket's capacity.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Iterable, Sized
from typing import Protocol

from .._work import PartitionState, Work
from .fair import FairQueue, Weight
from .limits import TypeLimit
from .policies import StrictPolicy, WeightedPolicy
from .waitlists import ByPriority, remove_where

Clock = Callable[[], float]
Schedule = Callable[[float, Callable[[], None]], object]
"""``schedule(delay_seconds, callback)``: run ``callback`` on the dispatcher's thread later."""
UNBOUNDED = sys.maxsize
"""The free slots of a dispatcher not told its room."""


class WorkQueue(Sized, Protocol):
    """A priority's queue: a plain deque, or a :class:`~.fair.FairQueue`."""

    def append(self, work: Work, /) -> None: ...

    def extend(self, works: Iterable[Work], /) -> None: ...

    def popleft(self) -> Work: ...


class Dispatcher:
    """Priority queues of ready jobs plus the jobs set aside by keys and limits."""

    def __init__(
        self,
        queues: int,
        policy: StrictPolicy | WeightedPolicy,
        *,
        key_ordering: bool,
        clock: Clock,
        schedule: Schedule,
        on_ready: Callable[[], None],
        fairness: Weight | None = None,
        room: Callable[[], int] | None = None,
    ) -> None:
        """``fairness``: the weight of a tenant, to share each priority among tenants (None:
        each queue is served in the order jobs were read). ``room``: the free concurrency
        slots (None: unbounded); the caller must pop whenever slots free, or a due limit's
        jobs wait for the next pop."""
        self.queues: list[WorkQueue] = (
            [deque() for _ in range(queues)]
            if fairness is None
            else [FairQueue(fairness, key_ordering=key_ordering) for _ in range(queues)]
        )
        self._fair = fairness
        self.admitted: deque[Work] = deque()
        self._policy = policy
        self._key_ordering = key_ordering
        self._clock = clock
        self._schedule = schedule
        self._on_ready = on_ready
        self._limits: set[TypeLimit[Work]] = set()
        """The limits that had jobs waiting (a revocation looks for its jobs there)."""
        self._room = room
        self._due: dict[TypeLimit[Work], None] = {}
        """Limits whose waiting jobs may start but found no free slot, in the order they came
        due (an ordered set): the next pop admits them first, before any other job."""

    def pop(self) -> Work | None:
        """The next job that may start now (its limit slot is reserved), or ``None``."""
        if self._due:
            self._drain_due(1)
        admitted = self.admitted
        if admitted:
            return admitted.popleft()
        queues = self.queues
        pick = self._policy.pick
        while True:
            index = pick(queues)
            if index < 0:
                return None
            work = queues[index].popleft()
            key = work.key
            if key is not None and self._key_ordering:
                keys = work.state.keys
                if key in keys:
                    successors = keys[key]
                    if successors is None:
                        keys[key] = deque((work,))
                    else:
                        successors.append(work)
                    continue
                keys[key] = None
            if (work.limit is None and work.tenant_limit is None) or self._enter(work):
                return work

    def pop_many(self, limit: int) -> list[Work]:
        """Up to ``limit`` jobs that may start now, in the order :meth:`pop` would give them."""
        if self._due:
            self._drain_due(limit)
        taken: list[Work] = []
        admitted = self.admitted
        while admitted and len(taken) < limit:
            taken.append(admitted.popleft())
        if self._key_ordering:
            return self._take_keyed(taken, limit)
        queues = self.queues
        nonempty = [queue for queue in queues if queue]
        if len(nonempty) == 1:
            # One priority has jobs: no choice to make, take them in order.
            queue = nonempty[0]
            if isinstance(queue, FairQueue):
                return self._take_fair(queue, taken, limit)
            while queue and len(taken) < limit:
                work = queue.popleft()
                if (work.limit is None and work.tenant_limit is None) or self._enter(work):
                    taken.append(work)
            return taken
        if self._fair is not None:
            return self._take_fair_picks(taken, limit)
        pick = self._policy.pick
        while len(taken) < limit:
            index = pick(queues)
            if index < 0:
                break
            work = queues[index].popleft()
            if (work.limit is None and work.tenant_limit is None) or self._enter(work):
                taken.append(work)
        return taken

    def _take_keyed(self, taken: list[Work], limit: int) -> list[Work]:
        while len(taken) < limit:
            work = self.pop()
            if work is None:
                break
            taken.append(work)
        return taken

    def _take_fair(self, queue: FairQueue, taken: list[Work], limit: int) -> list[Work]:
        while queue and len(taken) < limit:
            for work in queue.take(limit - len(taken)):
                if (work.limit is None and work.tenant_limit is None) or self._enter(work):
                    taken.append(work)
        return taken

    def _take_fair_picks(self, taken: list[Work], limit: int) -> list[Work]:
        """Several priorities have jobs: the policy picks over the queues' sizes, then each
        fair queue gives its share in one call (the shares are the policy's; within one call
        the jobs come grouped by priority rather than interleaved)."""
        queues = self.queues
        pick = self._policy.pick
        while len(taken) < limit:
            remaining = [len(queue) for queue in queues]
            counts = [0] * len(queues)
            for _ in range(limit - len(taken)):
                index = pick(remaining)
                if index < 0:
                    break
                remaining[index] -= 1
                counts[index] += 1
            if not any(counts):
                break
            for index, count in enumerate(counts):
                if count:
                    fair = queues[index]
                    assert isinstance(fair, FairQueue)
                    for work in fair.take(count):
                        if (work.limit is None and work.tenant_limit is None) or self._enter(work):
                            taken.append(work)
        return taken

    def release(self, work: Work) -> None:
        """``work`` finished (or was dropped after admission): free its limit slots and key."""
        limit = work.limit
        if limit is not None:
            limit.release()
            if limit.waiting:
                self._drain(limit)
        limit = work.tenant_limit
        if limit is not None:
            limit.release()
            if limit.waiting:
                self._drain(limit)
        key = work.key
        if key is not None and self._key_ordering:
            keys = work.state.keys
            successors = keys.get(key)
            if successors:
                successor = successors.popleft()
                if not successors:
                    keys[key] = None
                if (successor.limit is None and successor.tenant_limit is None) or self._enter(
                    successor
                ):
                    self.admitted.append(successor)
            else:
                keys.pop(key, None)

    def _enter(self, work: Work) -> bool:
        """Reserve ``work``'s tenant slot, then its type slot; False: it waits in one of them."""
        tenant = work.tenant_limit
        if tenant is not None and not self._admit(tenant, work):
            return False
        limit = work.limit
        return limit is None or self._admit(limit, work)

    def _admit(self, limit: TypeLimit[Work], work: Work) -> bool:
        # A limit with jobs waiting admits them first: newcomers queue behind them.
        if not limit.waiting and limit.try_admit(self._clock()):
            return True
        if limit not in self._limits:
            self._limits.add(limit)
            if not limit.waiting:
                limit.waiting = self._waitlist(fair=limit is work.limit)
        limit.waiting.append(work)
        self._arm(limit)
        return False

    def _waitlist(self, *, fair: bool) -> ByPriority:
        """A limit's waiting list: by priority, as the queues are served (see
        :mod:`.waitlists`); inside a priority by the tenants' turns for a type's limit
        (``fair``) when the starts are shared among tenants (a tenant's limit holds one
        tenant's jobs, in order). With key ordering, a key's jobs reach a limit one at a time
        (the others wait in the keys' table)."""
        fairness = self._fair if fair else None
        return ByPriority(
            [
                deque() if fairness is None else FairQueue(fairness, key_ordering=False)
                for _ in self.queues
            ],
            self._policy.fresh(),
        )

    def _drain_due(self, wanted: int) -> None:
        """Admit the due limits' jobs, in the order the limits came due, for ``wanted`` free
        slots (less the jobs admitted already); the limits left out stay due, in order."""
        due = list(self._due)
        self._due.clear()
        budget = wanted - len(self.admitted)
        for limit in due:
            budget -= self._drain(limit, budget)

    def _budget(self) -> int:
        """How many jobs a limit may admit outside a pop: the free slots not promised to
        admitted jobs; none while other limits are due (it takes its turn behind them)."""
        if self._due:
            return 0
        room = self._room
        if room is None:
            return UNBOUNDED
        return room() - len(self.admitted)

    def _drain(self, limit: TypeLimit[Work], budget: int | None = None) -> int:
        """Admit what may start of ``limit``'s waiting jobs, at most ``budget`` of them (None:
        as many as the free slots not promised to admitted jobs, and none while other limits
        are due: it takes its turn behind them); how many were admitted.

        Out of budget with a job that may start, the limit is due and takes nothing more (not a
        token, not a slot): no timer is armed, the next pop drains it."""
        if budget is None:
            budget = self._budget()
        now = self._clock()
        waiting = limit.waiting
        moved = 0
        while waiting:
            if moved >= budget:
                if not limit.may_admit(now):
                    break  # it waits for its timer or a freed slot of its cap, as below
                self._due[limit] = None
                return moved
            if not limit.try_admit(now):
                break
            work = waiting.popleft()
            type_limit = work.limit
            if (
                limit is work.tenant_limit
                and type_limit is not None
                and not self._admit(type_limit, work)
            ):
                continue  # on to wait in its type's limit, holding the tenant's slot
            self.admitted.append(work)
            moved += 1
        self._due.pop(limit, None)
        if waiting:
            self._arm(limit)
        return moved

    def _arm(self, limit: TypeLimit[Work]) -> None:
        """Wake up when the rate allows the limit's next job (the cap needs no timer)."""
        if limit.timer is not None or limit.capped or limit.bucket is None:
            return
        delay = limit.bucket.delay(self._clock())
        if delay == float("inf"):
            return  # no share of the rate: wait for an assignment change (refresh_limits)

        def fire() -> None:
            if limit.timer is not fire:
                return  # superseded by a timer at a newer rate (refresh_limits)
            limit.timer = None
            if self._drain(limit) or limit in self._due:
                self._on_ready()  # due: the pump drains it if a slot is free after all

        limit.timer = fire
        self._schedule(delay, fire)

    def refresh_limits(self, limits: Iterable[TypeLimit[Work]]) -> None:
        """Re-check waiting jobs after the limits' rates changed."""
        limits = list(limits)
        for limit in limits:
            # A timer armed at the old rate may be far off: the drain arms one at the new.
            limit.timer = None
        self._drain_all(limits)

    def _drain_all(self, limits: Iterable[TypeLimit[Work]]) -> None:
        """Admit what may start of the jobs waiting in ``limits``, and say so if any."""
        moved = False
        for limit in limits:
            if limit.waiting:
                moved = self._drain(limit) > 0 or moved
        if moved or self._due:
            self._on_ready()

    def drop(self, states: Iterable[PartitionState]) -> list[Work]:
        """Remove the not-started jobs of ``states`` and return them.

        Jobs admitted but not started give back their limit slot. The partitions' key tables are
        cleared, so their jobs still running release no successor when they finish.
        """
        doomed = set(states)

        def condemned(work: Work) -> bool:
            return work.state in doomed

        dropped: list[Work] = []
        freed: set[TypeLimit[Work]] = set()
        for queue in self.queues:
            dropped.extend(remove_where(queue, condemned))
        for work in remove_where(self.admitted, condemned):
            for limit in (work.limit, work.tenant_limit):
                if limit is not None:
                    limit.release()
                    freed.add(limit)
            dropped.append(work)
        for limit in self._limits:
            for work in remove_where(limit.waiting, condemned):
                if limit is work.limit and work.tenant_limit is not None:
                    work.tenant_limit.release()  # it held its tenant's slot
                    freed.add(work.tenant_limit)
                dropped.append(work)
        for state in doomed:
            for successors in state.keys.values():
                if successors:
                    dropped.extend(successors)
            state.keys.clear()
        # Jobs of other partitions waited for the slots freed: nothing else may start them (no
        # job of the limit need be running to release one, nor a timer be armed).
        self._drain_all(freed)
        return dropped
