"""What the consumer thread learns from the cluster besides messages.

The partition counts of the topics (the worker's share of a fleet-wide rate limit, and whether
a burst run's group has drained everything), the consumer lag of the owned partitions, and
whether the topics exist at all. All of it is asked for on the consumer thread after ``poll``
returned, never inside a rebalance callback (a metadata request there would break the
binding's call state, see ``Rebalance._give_up`` in ``rebalance``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline._brokerhealth import BrokerHealth
from pipeline._errors import TopicMissingError
from pipeline._ratelog import RateLimitedLog
from pipeline._topiccheck import missing_topics

from .._metrics import WorkerMetrics
from .._work import PartitionState

_log = logging.getLogger("pipeline.worker.consumer")

LAG_INTERVAL_S = 5.0
PAUSED_WATERMARK_TIMEOUT_S = 0.5
"""How long the high watermark of a paused partition is waited for (see :meth:`ClusterView.
update_lag`): one such query a paused partition every ``LAG_INTERVAL_S``."""
TOPIC_CHECK_RETRY_S = 1.0


SHARE_RETRY_S = 1.0
"""How soon partition counts that could not be read are asked for again."""


class ClusterView:
    """Partition counts, lag and topic existence for one consumer (its thread only)."""

    def __init__(
        self,
        consumer: Consumer,
        topics: Mapping[str, object],
        states: Mapping[tuple[str, int], PartitionState],
        metrics: WorkerMetrics,
        namespace: str,
        *,
        health: BrokerHealth | None = None,
        written: Sequence[str] = (),
    ) -> None:
        self._consumer = consumer
        self._health = health
        """Whether Kafka is reachable: no uncached query while it is not (None: ask anyway)."""
        self._topics = list(topics)
        self._states = states
        self._metrics = metrics
        self._namespace = namespace
        self.partition_counts: dict[str, int] = {}
        self.share_changed = False
        """Set when the assignment changed: :meth:`share` is due after the next poll."""
        self._share_retry_at = 0.0
        self._next_lag = 0.0
        self._check_topics_at: float | None = None
        self._written = list(written)
        """Topics the worker writes (its moves): checked once, at start (:meth:`check_written`)."""
        self._check_written_at: float | None = 0.0 if written else None
        self._errors = RateLimitedLog(_log, interval_s=10.0)

    def known_partition_counts(self) -> dict[str, int] | None:
        counts = self.partition_counts
        return counts if len(counts) == len(self._topics) else None

    def share_due(self, now: float) -> bool:
        """Whether :meth:`share` is due: the assignment changed, or a count was not read (asked
        again at most every ``SHARE_RETRY_S``)."""
        return self.share_changed and now >= self._share_retry_at

    def share(self) -> tuple[dict[str, int], dict[str, int]]:
        """Partitions owned and in all, per topic (counts read again from the cluster). A
        count not read (Kafka did not answer, or answered for the topic with an error: a
        leader moving) is asked again: without it a ``--burst`` run never ended, its check
        waiting for the counts of every topic."""
        self.share_changed = False
        unread: list[str] = []
        try:
            for topic in self._topics:
                metadata = self._consumer.list_topics(topic, timeout=5.0)
                found = metadata.topics.get(topic)
                if found is not None and found.error is None:
                    self.partition_counts[topic] = len(found.partitions)
                else:
                    unread.append(f"{topic} ({found.error.str() if found else 'not listed'})")
        except KafkaException as exc:
            unread.append(f"all ({exc})")
        if unread:
            self._errors.warning(
                "share", "could not read the partition counts of %s; asking again",
                ", ".join(unread),
            )  # fmt: skip
            self.share_changed = True  # after the next poll, SHARE_RETRY_S from now
            self._share_retry_at = time.monotonic() + SHARE_RETRY_S
        owned = dict.fromkeys(self._topics, 0)
        for topic, _ in self._states:
            owned[topic] += 1
        return owned, dict(self.partition_counts)

    def update_lag(self, now: float) -> None:
        """Every ``LAG_INTERVAL_S``: high watermark minus position, per owned partition.

        librdkafka's cached high watermark comes from fetch responses, and a paused partition
        is not fetched: the lag of a saturated worker's partitions would stand still. So the
        high watermark of a paused partition is asked of its leader (one query, waiting at most
        ``PAUSED_WATERMARK_TIMEOUT_S``), unless Kafka is unreachable (the query would only
        time out); after a query fails the round's others take the cached value.
        """
        if now < self._next_lag:
            return
        self._next_lag = now + LAG_INTERVAL_S
        states = list(self._states.values())
        if not states:
            self._metrics.lag = {}
            return
        tps = [TopicPartition(s.topic, s.partition) for s in states]
        lag: dict[tuple[str, int], int] = {}
        ask = self._health is None or not self._health.down
        try:
            positions = self._consumer.position(tps)
            for state, tp in zip(states, positions, strict=True):
                fresh = None
                if state.paused and ask:
                    fresh = self._ask_watermarks(tp)
                    ask = fresh is not None
                low, high = fresh or self._consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:
                    continue
                position = tp.offset if tp.offset >= 0 else state.committed
                if position < 0:
                    position = low
                lag[(state.topic, state.partition)] = max(0, high - position)
        except KafkaException as exc:
            self._errors.warning("lag", "could not read consumer lag: %s", exc)
            return
        self._metrics.lag = lag

    def _ask_watermarks(self, tp: TopicPartition) -> tuple[int, int] | None:
        """``tp``'s watermarks from its leader (None: no answer in time)."""
        try:
            return self._consumer.get_watermark_offsets(
                tp, timeout=PAUSED_WATERMARK_TIMEOUT_S, cached=False
            )
        except KafkaException as exc:
            self._errors.warning("watermarks", "could not read a paused partition's end: %s", exc)
            return None

    def topic_missing(self, now: float) -> None:
        """The consumer said a subscribed topic is not available: ask the cluster soon."""
        if self._check_topics_at is None:
            self._check_topics_at = now

    def check_written(self, now: float) -> None:
        """Once Kafka answers: raise :class:`TopicMissingError` if a topic the worker moves jobs
        to is missing. Nothing else tells: the first failed job's move would abort every
        transaction of the moves (and with them every commit of the offsets), for good."""
        if self._check_written_at is not None and now >= self._check_written_at:
            self._check_written_at = self._check(self._written, now)

    def check_topics(self, now: float) -> None:
        """Raise :class:`TopicMissingError` if the cluster confirms topics are missing."""
        if self._check_topics_at is not None and now >= self._check_topics_at:
            self._check_topics_at = self._check(self._topics, now)

    def _check(self, topics: list[str], now: float) -> float | None:
        """Raise :class:`TopicMissingError` if the cluster lacks some of ``topics``; when to
        ask again (None: they are all there)."""
        try:
            missing = missing_topics(self._consumer, topics, timeout=5.0)
        except KafkaException as exc:
            _log.debug("could not check the topics, retrying: %s", exc)
            return now + TOPIC_CHECK_RETRY_S
        if missing:
            raise TopicMissingError(missing, self._namespace)
        return None
