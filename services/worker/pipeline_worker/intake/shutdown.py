"""The consumer thread's way out: the final commit, then its Kafka clients closed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from confluent_kafka import Consumer

from pipeline._brokerhealth import BrokerHealth

from .._work import PartitionState
from ..commit.committer import Committer

if TYPE_CHECKING:
    from ..commit.moves import Mover

_log = logging.getLogger("pipeline.worker.consumer")

FINAL_COMMIT_S = 10.0
"""How long the last commit may keep retrying while the group rebalances."""


def final_commit(
    committer: Committer,
    states: Mapping[tuple[str, int], PartitionState],
    health: BrokerHealth,
    *,
    moves: bool,
    drain_moves: Callable[[], None],
    poll: Callable[[float], None],
) -> None:
    """Commit every owned partition synchronously before closing, whatever it takes.

    A commit sent while the group rebalances is refused (the generation changes under it).
    Then keep taking part in the rebalance (poll) and try again with the new generation.

    ``moves``: the worker has a mover, whose queued moves ``drain_moves`` writes first;
    ``poll(timeout)`` polls the consumer (and hands what it returns).
    """
    deadline = time.monotonic() + FINAL_COMMIT_S
    if moves and not committer.in_transaction:
        # As in the chores: no transaction opens while a commit is unanswered (see
        # Committer.awaiting); polling serves its answer.
        while committer.awaiting(time.monotonic()) and not health.down:
            poll(0.05)
    drain_moves()
    if health.down and states:
        # A synchronous commit would wait for the group coordinator up to the session
        # timeout, and the stop (a burst run giving up on Kafka included) with it.
        _log.error(
            "not committing the final offsets: %s; the jobs finished since the last "
            "commit will run again",
            health.describe(),
        )
        return
    while not committer.commit(states.values(), time.monotonic(), sync=True, clean=True):
        if time.monotonic() >= deadline:
            _log.error(
                "could not commit the final offsets within %gs; the jobs finished since the "
                "last commit will run again",
                FINAL_COMMIT_S,
            )
            return
        until = time.monotonic() + 0.2
        while time.monotonic() < until:
            poll(0.05)
        # Moves left in no transaction (Kafka did not answer) keep their partition out of the
        # commit until they are written again: only a drain writes them.
        if moves and (committer.in_transaction or not committer.awaiting(time.monotonic())):
            drain_moves()


def close_clients(consumer: Consumer, mover: Mover | None) -> None:
    """Close the consumer, then the moves' transactional producer; a failure is only logged."""
    try:
        consumer.close()
    except Exception as exc:  # already closed, or the broker is gone
        _log.warning("closing the consumer failed: %s", exc)
    if mover is not None:
        try:
            mover.close()
        except Exception as exc:
            _log.warning("closing the transactional producer failed: %s", exc)
