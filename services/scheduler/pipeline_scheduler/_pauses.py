"""Why the leader stops reading a source partition, told in its log.

A partition pauses behind a message that may not be routed yet: the head of a wait tier before
it may leave it (nothing to tell), or any message while the partition is full (see
:attr:`._progress.PartitionProgress.full`). Full, it is told why: its progress record would
outgrow a message, or, replaying a record that leaves little room, it holds a few jobs at a time
(one, with no room left); that last one is told once a term, as it pauses again and again.
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
        self._crowded: set[Where] = set()
        """The partitions told that a replayed record leaves room for few held jobs, this
        term."""

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
        elif progress.crowded:
            if where not in self._crowded:
                self._crowded.add(where)
                _log.warning(
                    "%s [%d]: the progress record committed before this leader names so many "
                    "held offsets that this leader's records have room for few more beside them "
                    "(it was written by an earlier release, or under a larger "
                    "message.max.bytes): until the partition is read up to offset %d, it holds "
                    "only a few jobs not yet due at a time (one, with no room left), and reads "
                    "nothing after them before they are released (due jobs pass at once)",
                    *where,
                    progress.replay_until,
                )
        elif progress.full:
            _log.warning(
                "%s [%d] holds %d jobs in %d runs, as many as a progress record may name "
                "(or as may fit in message.max.bytes): reading it is paused until some are "
                "released",
                *where,
                progress.held_count,
                progress.runs,
            )
