"""The priority policies: which priority's queue serves the next job.

``strict`` serves the first non-empty queue in priority order; ``weighted`` shares the starts by
the priorities' weights (smooth weighted round robin), so a low priority is never starved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Policy = Literal["strict", "weighted"]


class StrictPolicy:
    """Always the first non-empty queue: lower priorities wait until higher ones are empty.

    Not for the jobs waiting for a limit, though (:meth:`fresh`): one of those may hold its
    tenant's slot while it waits, so a low one starved there would hold back every job of its
    tenant. They leave by ``weights``: mostly the higher priorities, never none of the lower."""

    __slots__ = ("_weights",)

    def __init__(self, weights: Sequence[int]) -> None:
        self._weights = list(weights)

    def fresh(self) -> WeightedPolicy:
        """The policy of a limit's waiting jobs (see above), with credits of its own."""
        return WeightedPolicy(self._weights)

    def pick(self, queues: Sequence[object]) -> int:
        for index, queue in enumerate(queues):
            if queue:
                return index
        return -1


class WeightedPolicy:
    """Smooth weighted round-robin over the non-empty queues (nginx's algorithm).

    Each pick adds every non-empty queue's weight to its credit, picks the highest credit and
    takes the total off it. Over any window the picks follow the weights closely and evenly
    interleaved (10:5:3:1 gives 19 picks per cycle); an empty queue earns no credit, so it cannot
    burst when it fills again.
    """

    __slots__ = ("_credit", "_weights")

    def __init__(self, weights: Sequence[int]) -> None:
        if not weights or any(w < 1 for w in weights):
            raise ValueError(f"weights must be positive integers, got {list(weights)}")
        self._weights = list(weights)
        self._credit = [0] * len(weights)

    def fresh(self) -> WeightedPolicy:
        """The same weights for another set of queues, with credits of its own."""
        return WeightedPolicy(self._weights)

    def pick(self, queues: Sequence[object]) -> int:
        credit = self._credit
        weights = self._weights
        best = -1
        total = 0
        for index, queue in enumerate(queues):
            if queue:
                weight = weights[index]
                credit[index] += weight
                total += weight
                if best < 0 or credit[index] > credit[best]:
                    best = index
        if best >= 0:
            credit[best] -= total
        return best


def make_policy(policy: Policy, weights: Sequence[int]) -> StrictPolicy | WeightedPolicy:
    if policy == "strict":
        return StrictPolicy(weights)
    if policy == "weighted":
        return WeightedPolicy(weights)
    raise ValueError(f"unknown policy {policy!r}; use strict or weighted")
