"""The jobs waiting for one limit, by priority, and taking jobs out of any waiting list.

A capped or rate-limited job type collects jobs of every priority while its slots are taken.
:class:`ByPriority` keeps them in one list per priority and gives a freed slot to a priority by
the worker's weights (smooth weighted round robin, as the ``weighted`` policy serves the
queues), so a critical job of a capped type does not wait behind the low ones that reached the
limit first, and a low one gets its share. Not strictly by priority, even under the ``strict``
policy: a job waiting for its type's limit holds its tenant's slot, and a low one starved there
would hold back every other job of its tenant. Inside a priority they leave in the order they
came, or by their tenants' turns (:mod:`.fair`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from .fair import FairQueue

if TYPE_CHECKING:
    from .._work import Work
    from .limits import Waitlist


class Picker(Protocol):
    """A priority policy: the index of the queue to serve next (-1: all are empty)."""

    def pick(self, queues: Sequence[object]) -> int: ...


class ByPriority:
    """One limit's waiting jobs, a waiting list per priority, served by a priority policy."""

    __slots__ = ("_lists", "_policy")

    def __init__(self, lists: Sequence[Waitlist[Work]], policy: Picker) -> None:
        """``lists``: one per priority, in the worker's priority order (``Work.state.pidx``);
        ``policy``: this limit's own (a weighted policy keeps credits per set of queues)."""
        self._lists = list(lists)
        self._policy = policy

    def __len__(self) -> int:
        return sum(map(len, self._lists))

    def append(self, work: Work, /) -> None:
        self._lists[work.state.pidx].append(work)

    def popleft(self) -> Work:
        index = self._policy.pick(self._lists)
        if index < 0:
            raise IndexError("popleft from an empty waiting list")
        return self._lists[index].popleft()

    def remove_where(self, condemned: Callable[[Work], bool]) -> list[Work]:
        removed: list[Work] = []
        for waiting in self._lists:
            removed += remove_where(waiting, condemned)
        return removed


def remove_where(queue: Waitlist[Work], condemned: Callable[[Work], bool]) -> list[Work]:
    """Take the condemned jobs out of ``queue`` (keeping the order of the others)."""
    if isinstance(queue, FairQueue | ByPriority):
        return queue.remove_where(condemned)
    assert isinstance(queue, deque)
    removed = [w for w in queue if condemned(w)]
    if removed:
        kept = [w for w in queue if not condemned(w)]
        queue.clear()
        queue.extend(kept)
    return removed
