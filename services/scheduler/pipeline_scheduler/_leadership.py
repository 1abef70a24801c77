"""Leadership: the process that owns the one partition of ``<ns>.scheduler-control`` leads.

Every scheduler process joins the consumer group ``<ns>.scheduler`` on that topic; Kafka's group
protocol gives its only partition to exactly one live member. When that member dies, the group
notices within ``session.timeout.ms`` and gives the partition to a standby. Nothing is ever
written to the topic: the assignment is the lease. Safety does not rest on it alone: the
leader's transactional producer is fenced by the next leader's ``init_transactions()``.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from pipeline._brokerhealth import BrokerHealth
from pipeline._errors import TopicMissingError
from pipeline._settings import Settings
from pipeline._topiccheck import is_missing_topic, missing_topics
from pipeline._topics import scheduler_group
from pipeline._topicspec import scheduler_control_topic

_log = logging.getLogger("pipeline.scheduler.leadership")


class Leadership:
    """A group member on the control topic; ``is_leader`` follows its assignment."""

    def __init__(self, settings: Settings) -> None:
        session = settings.scheduler.session_timeout_ms
        conf: dict[str, Any] = {
            "group.id": scheduler_group(settings),
            "session.timeout.ms": session,
            "heartbeat.interval.ms": max(100, session // 6),
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
            **settings.client_config(),
            # Polled all the time, leader or standby: it reports the cluster's reachability.
            **BrokerHealth.of(settings.bootstrap_servers).callbacks("leadership", stats=True),
        }
        self.topic = scheduler_control_topic(settings.namespace)
        self._namespace = settings.namespace
        self._consumer = Consumer(conf)
        self.is_leader = False
        self.changed = False
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions and not self.is_leader:
            _log.info("leadership acquired")
            self.is_leader = True
            self.changed = True

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions and self.is_leader:
            _log.info("leadership revoked")
            self.is_leader = False
            self.changed = True

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.is_leader:
            _log.warning("leadership lost (session timed out)")
            self.is_leader = False
            self.changed = True

    def poll(self, timeout: float) -> None:
        """Serve the group protocol; assignment callbacks run here.

        Raises :class:`TopicMissingError` when the control topic does not exist: no process of
        this namespace could ever lead.
        """
        message = self._consumer.poll(timeout)
        error = message.error() if message is not None else None
        if error is None:
            return
        if is_missing_topic(error):
            try:
                missing = missing_topics(self._consumer, [self.topic], timeout=5.0)
            except KafkaException as exc:  # asked again when the consumer says so again
                _log.debug("could not check the control topic: %s", exc)
                return
            if missing:
                raise TopicMissingError(missing, self._namespace)
        _log.debug("control topic", extra={"error": error.str()})

    def close(self) -> None:
        """Leave the group, so a standby takes over at once."""
        self.is_leader = False
        self._consumer.close()
