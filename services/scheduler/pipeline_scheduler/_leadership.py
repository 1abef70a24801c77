"""Leadership: the process that owns the one partition of ``<ns>.scheduler-control`` leads.

Every scheduler process joins the consumer group ``<ns>.scheduler`` on that topic; Kafka's group
protocol gives its only partition to exactly one live member. When that member dies, the group
notices within ``session.timeout.ms`` and gives the partition to a standby. Nothing is ever
written to the topic: the assignment is the lease. Safety does not rest on it alone: the
leader's transactional producer is fenced by the next leader's ``init_transactions()``.

The brokers bound the session timeout (``group.min.session.timeout.ms``, 6 s by default, and
``group.max.session.timeout.ms``) and refuse a join outside those bounds. A scheduler whose
``scheduler.session_timeout_ms`` they refuse warns, naming the broker setting, and joins again
with the nearest timeout they allow (Kafka's default minimum where the bounds cannot be read),
so a short default never leaves a namespace without a leader.

A member that holds the partition but cannot lead (its term does not start) gives it up with
:meth:`Leadership.leave`, stays out for :attr:`Leadership.handover_s`, and joins again
(:meth:`Leadership.rejoin`): a standby has the partition by then, and the sticky assignment
leaves it there; where no other member is, it comes back to this one.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    ConfigResource,
    ResourceType,
)

from pipeline._acls import Role
from pipeline._adminsession import AdminSession
from pipeline._brokerhealth import BrokerHealth
from pipeline._clientlog import is_fatal
from pipeline._errors import NotAuthorizedError, PipelineError, TopicMissingError
from pipeline._newclient import client
from pipeline._settings import Settings
from pipeline._topiccheck import REFUSED_READS, is_missing_topic, missing_topics
from pipeline._topics import scheduler_group
from pipeline._topicspec import scheduler_control_topic
from pipeline._writecheck import check_writes

_log = logging.getLogger("pipeline.scheduler.leadership")

MIN_SESSION = "group.min.session.timeout.ms"
MAX_SESSION = "group.max.session.timeout.ms"
KAFKA_MIN_SESSION_MS = 6000
"""Kafka's default ``group.min.session.timeout.ms``: the fallback where the bounds are unread."""


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """Six beats per session: five can be lost before a healthy leader loses its lead, and a
    standby learns of the rebalance that makes it leader within one."""
    return max(100, session_timeout_ms // 6)


def session_bounds_ms(settings: Settings) -> tuple[int, int] | None:
    """The brokers' ``group.min/max.session.timeout.ms``; ``None`` where they cannot be read
    (no broker answers, or no ``DESCRIBE_CONFIGS`` on the cluster)."""
    try:
        admin = AdminSession(settings, timeout=10)
        broker = min(admin.metadata().brokers)
        resource = ConfigResource(ResourceType.BROKER, str(broker))
        futures = admin.client.describe_configs([resource], request_timeout=admin.remaining())
        entries = admin.result(futures[resource], "describe the configs of a broker", None)
        return int(entries[MIN_SESSION].value), int(entries[MAX_SESSION].value)
    except (PipelineError, KafkaException, KeyError, TypeError, ValueError) as exc:
        _log.debug("could not read the session timeout bounds: %s", exc)
        return None


def allowed_session_ms(asked: int, bounds: tuple[int, int] | None) -> int:
    """The session timeout nearest ``asked`` within the brokers' ``bounds`` (min, max); where
    they are unknown, at least Kafka's default minimum."""
    low, high = bounds or (KAFKA_MIN_SESSION_MS, max(asked, KAFKA_MIN_SESSION_MS))
    return min(max(asked, low), high)


class MembershipEndedError(PipelineError):
    """Kafka ended this process's membership of the scheduler group for good."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            f"Kafka ended this scheduler's membership of its group for good ({reason}); "
            "restart it (two processes given one group.instance.id in `kafka` do this)"
        )


class Leadership:
    """A group member on the control topic; ``is_leader`` follows its assignment.

    A process that may not write a topic a leader writes does not join: it would lead, and
    fail at its first write there. Its constructor raises :class:`NotAuthorizedError` then
    (:func:`~pipeline._writecheck.check_writes`)."""

    def __init__(self, settings: Settings) -> None:
        check_writes(settings, Role.SCHEDULER)
        self.topic = scheduler_control_topic(settings.namespace)
        self._settings = settings
        self._namespace = settings.namespace
        self.session_timeout_ms = settings.scheduler.session_timeout_ms
        self.is_leader = False
        self.changed = False
        self._left = False
        self._consumer = self._join()

    def _join(self) -> Consumer:
        session = self.session_timeout_ms
        conf: dict[str, Any] = {
            "group.id": scheduler_group(self._settings),
            "session.timeout.ms": session,
            "heartbeat.interval.ms": heartbeat_interval_ms(session),
            "partition.assignment.strategy": "cooperative-sticky",
            "enable.auto.commit": False,
            **self._settings.client_config(),
            # Polled all the time, leader or standby: it reports the cluster's reachability.
            **BrokerHealth.of(self._settings.bootstrap_servers).callbacks("leadership", stats=True),
        }
        consumer = client(Consumer, conf)
        consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        return consumer

    def _rejoin_within_bounds(self) -> None:
        """The brokers refused the session timeout: join again with one they allow."""
        asked = self.session_timeout_ms
        bounds = session_bounds_ms(self._settings)
        allowed = allowed_session_ms(asked, bounds)
        shown = (
            f"{MIN_SESSION}={bounds[0]}, {MAX_SESSION}={bounds[1]}" if bounds else "bounds unread"
        )
        if allowed == asked:  # within the bounds as read: librdkafka keeps asking as it is
            _log.debug("session timeout %d ms refused (%s)", asked, shown)
            return
        _log.warning(
            "the brokers refuse scheduler.session_timeout_ms=%d (%s): joining with %d ms, so a "
            "standby takes over about that long after the leader dies. Lower %s on the brokers, "
            "or set scheduler.session_timeout_ms within their bounds",
            asked,
            shown,
            allowed,
            MIN_SESSION,
        )
        if self.is_leader:
            self.is_leader = False
            self.changed = True
        self._consumer.close()
        self.session_timeout_ms = allowed
        self._consumer = self._join()

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
        if error.code() == KafkaError.INVALID_SESSION_TIMEOUT:
            self._rejoin_within_bounds()
            return
        refused = REFUSED_READS.get(error.code())
        if refused is not None:
            # Kafka's ACLs: librdkafka tries again for good, and the scheduler stood by, never
            # leading, /healthz ok. It stops (exit 4), naming what it lacks.
            name = scheduler_group(self._settings) if refused == "GROUP" else self.topic
            user = self._settings.security.sasl_username
            raise NotAuthorizedError(refused, name, "READ", user, Role.SCHEDULER.value)
        if is_fatal(error):
            # E.g. its static member id taken by another process: it can never lead again.
            self.is_leader = False
            raise MembershipEndedError(error.str())
        if is_missing_topic(error):
            try:
                missing = missing_topics(self._consumer, [self.topic], timeout=5.0)
            except KafkaException as exc:  # asked again when the consumer says so again
                _log.debug("could not check the control topic: %s", exc)
                return
            if missing:
                raise TopicMissingError(missing, self._namespace)
        _log.debug("control topic", extra={"error": error.str()})

    @property
    def handover_s(self) -> float:
        """How long a member that left stays out before it joins again: the session timeout,
        within which Kafka expires a member that left without saying so (a static one, with a
        ``group.instance.id``, sends no leave), and 2 s for the rebalance that gives the
        partition to a standby (whose heartbeats, six a session, see it at once). Joined sooner,
        it could be given the partition back in that same rebalance."""
        return self.session_timeout_ms / 1000 + 2.0

    def leave(self) -> None:
        """Leave the group without stopping, so that Kafka gives the partition to another
        member if there is one; :meth:`rejoin` joins again."""
        if self.is_leader:
            self.is_leader = False
            self.changed = True
        if not self._left:
            self._left = True
            self._consumer.close()

    def rejoin(self) -> None:
        """Join the group again after :meth:`leave`, as a standby until it is given the
        partition."""
        if self._left:
            self._consumer = self._join()
            self._left = False

    def close(self) -> None:
        """Leave the group, so a standby takes over at once."""
        self.is_leader = False
        if not self._left:
            self._left = True
            self._consumer.close()
