"""Whether the topics a leader reads gained partitions during its term.

A term assigns itself every partition of ``<ns>.deferred`` and of the wait tiers when it
starts. Partitions added later (``pipeline topics apply`` with more partitions) would not be
read until the next term, which may be weeks away, and the delayed jobs producers write to
them would wait as long. The leader looks at the topics' metadata now and then and ends its
term when a count changed; the next term, begun at once, reads them all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException

__all__ = ["PartitionWatch"]

_log = logging.getLogger("pipeline.scheduler")


class PartitionWatch:
    """The partition counts a term began with, compared with the cluster's every ``every_s``
    (``scheduler.partitions_check_s``: one metadata request, answered by any broker)."""

    def __init__(
        self,
        counts: Mapping[str, int],
        *,
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counts = dict(counts)
        self._every_s = every_s
        self._clock = clock
        self._next = clock() + every_s

    def changed(self, list_topics: Callable[..., Any]) -> bool:
        """Whether a topic's partition count differs from the term's (asked at most every
        ``every_s``; a metadata request that fails answers no, and is asked again next time).
        ``list_topics``: the consumer's."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._every_s
        try:
            metadata = list_topics(timeout=10.0)
        except KafkaException as exc:
            _log.debug("could not read the topics' metadata: %s", exc)
            return False
        for topic, count in self._counts.items():
            meta = metadata.topics.get(topic)
            if meta is None or meta.error is not None:
                continue  # a topic gone is the consumer's error to report
            if len(meta.partitions) != count:
                _log.info(
                    "%s has %d partitions, %d when this term began: starting a new term to "
                    "read them all",
                    topic,
                    len(meta.partitions),
                    count,
                )
                return True
        return False
