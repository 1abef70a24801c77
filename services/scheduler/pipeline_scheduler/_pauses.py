"""Why the leader stops reading a source partition, told in its log.

A partition pauses behind a message that may not be routed yet: the head of a wait tier before
it may leave it (nothing to tell), or any message while the partition is full (see
:attr:`._progress.PartitionProgress.full`). Full, it is told why: its progress record would
outgrow a message, or, replaying a record larger than this leader's room, it holds one job at a
time; that last one is told once a term, as it pauses again at every such job.
"""

from __future__ import annotations

import logging

from ._progress import PartitionProgress

_log = logging.getLogger("pipeline.scheduler")

Where = tuple[str, int]


class PauseLog:
    """Tells why each partition of one term pauses (see the module's doc)."""

    def __init__(self, state_topic: str, max_bytes: int) -> None:
        """``max_bytes``: the producer's ``message.max.bytes``."""
        self._state_topic = state_topic
        self._max_bytes = max_bytes
        self._one_at_a_time: set[Where] = set()
        """The partitions told that they hold one job at a time, this term."""

    def paused(self, where: Where, progress: PartitionProgress) -> None:
        overflow = progress.replay_overflow
        if overflow is not None:
            _log.error(
                "%s [%d]: what is left of the progress record committed before this leader "
                "(held offsets below %d) takes more than message.max.bytes lets it write: "
                'nothing more of the partition is routed until kafka."message.max.bytes" '
                "(and max.message.bytes of %s) is at least %d and the schedulers restarted",
                *where,
                progress.replay_until,
                self._state_topic,
                self._max_bytes + overflow,
            )
        elif not progress.full:
            return
        elif progress.held_count > 1 or not progress.replaying:
            _log.warning(
                "%s [%d] holds %d jobs in %d runs, as many as a progress record may name "
                "(or as may fit in message.max.bytes): reading it is paused until some are "
                "released",
                *where,
                progress.held_count,
                progress.runs,
            )
        elif where not in self._one_at_a_time:
            self._one_at_a_time.add(where)
            _log.warning(
                "%s [%d]: the progress record committed before this leader names so many held "
                "offsets that this leader's records have room for no more beside them (it was "
                "written by an earlier release, or under a larger message.max.bytes): until "
                "the partition is read up to offset %d, each job not yet due is held alone, "
                "and nothing after it is read before it is released (due jobs pass at once)",
                *where,
                progress.replay_until,
            )
