"""Fairness across tenants inside one priority: deficit round robin over the jobs held.

A :class:`FairQueue` stands where a priority's plain deque would: the decoder appends to it, the
dispatcher pops from it. Inside, each tenant with jobs waiting has a *lane* (a deque, in offset
order per partition), and the lanes take turns (Shreedhar and Varghese's deficit round robin,
every job costing 1): a lane's turn adds its tenant's weight to its credit and serves jobs while
the credit lasts, so over a window with several tenants waiting their starts follow their
weights, and one tenant's flood delays another's jobs by at most a round of the others' turns.
A lane that empties is removed with its credit (an idle tenant saves nothing up), so the lanes
never outnumber the jobs held.

Fairness reorders only what the worker holds: the jobs read from Kafka and not started, at most
``buffer_size`` per partition (:mod:`..intake.flow`). A tenant's jobs that are still behind the
held window in their partition cannot be favoured (docs/tenants.md states the bound). Reordering
is safe for the commit point, which is the lowest unfinished offset whatever order jobs end in.

Per-key ordering (``key_ordering``) needs a key's jobs to leave the queue in offset order. A key
normally belongs to one tenant, but nothing forces that, so while a key has jobs queued here its
later jobs join the lane of its first, whatever their tenant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._work import PartitionState, Work

Weight = Callable[[str | None], float]
"""The weight of a tenant (``None``: jobs without one, which share one lane)."""


class Lane:
    """The queued jobs of one tenant at one priority."""

    __slots__ = ("credit", "jobs", "tenant", "weight")

    def __init__(self, tenant: str | None, weight: float) -> None:
        self.tenant = tenant
        self.weight = weight
        self.credit = 0.0
        self.jobs: deque[Work] = deque()


class KeyRun:
    """A key's jobs queued here: the lane they all join, and how many there are."""

    __slots__ = ("count", "lane")

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.count = 1


class FairQueue:
    """The jobs of one priority, in tenant lanes served by deficit round robin."""

    __slots__ = ("_keyed", "_lanes", "_ring", "_size", "_weight")

    def __init__(self, weight: Weight, *, key_ordering: bool) -> None:
        self._weight = weight
        self._lanes: dict[str | None, Lane] = {}
        self._ring: deque[Lane] = deque()
        """The lanes with jobs; the first one has the turn."""
        self._size = 0
        self._keyed: dict[tuple[PartitionState, bytes], KeyRun] | None = (
            {} if key_ordering else None
        )
        """Keys with jobs queued: the lane they all join and how many there are."""

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    @property
    def lanes(self) -> int:
        """Tenants with jobs queued here."""
        return len(self._ring)

    def append(self, work: Work, /) -> None:
        self.extend((work,))

    def extend(self, works: Iterable[Work], /) -> None:
        """Queue ``works`` (the decoder hands a partition's jobs of a batch at once)."""
        keyed = self._keyed
        lanes = self._lanes
        count = 0
        for work in works:
            count += 1
            if keyed is not None and work.key is not None:
                slot = (work.state, work.key)
                run = keyed.get(slot)
                if run is not None:
                    run.count += 1
                    run.lane.jobs.append(work)
                    continue
            tenant = work.job.tenant
            lane = lanes.get(tenant)
            if lane is None:
                lane = lanes[tenant] = Lane(tenant, self._weight(tenant))
                self._ring.append(lane)
            lane.jobs.append(work)
            if keyed is not None and work.key is not None:
                keyed[(work.state, work.key)] = KeyRun(lane)
        self._size += count

    def popleft(self) -> Work:
        """The next job by the lanes' turns (IndexError when empty, as a deque)."""
        taken = self.take(1)
        if not taken:
            raise IndexError("pop from an empty FairQueue")
        return taken[0]

    def take(self, count: int) -> list[Work]:
        """Up to ``count`` jobs, by the lanes' turns: each turn adds the lane's weight to its
        credit and serves a job per whole unit of credit."""
        taken: list[Work] = []
        ring = self._ring
        lanes = self._lanes
        while ring and len(taken) < count:
            lane = ring[0]
            jobs = lane.jobs
            if len(ring) == 1:
                # One tenant waiting: nothing to share, its credit stays as it is.
                for _ in range(min(count - len(taken), len(jobs))):
                    taken.append(jobs.popleft())
                if not jobs:
                    ring.popleft()
                    del lanes[lane.tenant]
                continue
            if lane.credit < 1.0:
                lane.credit += lane.weight
                if lane.credit < 1.0:
                    ring.rotate(-1)  # a weight below 1 takes several turns to earn one job
                    continue
            serve = min(int(lane.credit), count - len(taken), len(jobs))
            for _ in range(serve):
                taken.append(jobs.popleft())
            if not jobs:
                ring.popleft()
                del lanes[lane.tenant]  # its credit goes with it: an idle tenant saves nothing
            else:
                lane.credit -= serve
                if lane.credit < 1.0:
                    ring.rotate(-1)
        self._size -= len(taken)
        if self._keyed is not None:
            self._taken_keys(taken, self._keyed)
        return taken

    @staticmethod
    def _taken_keys(taken: list[Work], keyed: dict[tuple[PartitionState, bytes], KeyRun]) -> None:
        for work in taken:
            if work.key is not None:
                slot = (work.state, work.key)
                run = keyed[slot]
                run.count -= 1
                if not run.count:
                    del keyed[slot]

    def remove_where(self, condemned: Callable[[Work], bool]) -> list[Work]:
        """Take the condemned jobs out (the others keep their order and lanes)."""
        removed: list[Work] = []
        for lane in list(self._ring):
            doomed = [w for w in lane.jobs if condemned(w)]
            if not doomed:
                continue
            removed.extend(doomed)
            kept = [w for w in lane.jobs if not condemned(w)]
            lane.jobs.clear()
            lane.jobs.extend(kept)
            if not kept:
                self._ring.remove(lane)
                del self._lanes[lane.tenant]
        if removed:
            self._size -= len(removed)
            keyed = self._keyed
            if keyed is not None:
                keyed.clear()
                for lane in self._ring:
                    for work in lane.jobs:
                        if work.key is not None:
                            slot = (work.state, work.key)
                            run = keyed.get(slot)
                            if run is None:
                                keyed[slot] = KeyRun(lane)
                            else:
                                run.count += 1
        return removed
