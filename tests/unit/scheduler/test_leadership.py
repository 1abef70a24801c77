"""The leadership group's timings: the heartbeat that goes with a session timeout, and the
session timeout a scheduler falls back to when the brokers refuse the one it was given."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline import NotAuthorizedError, Settings
from pipeline._topicspec import scheduler_control_topic
from pipeline_scheduler._leadership import (
    KAFKA_MIN_SESSION_MS,
    Leadership,
    allowed_session_ms,
    heartbeat_interval_ms,
)


def test_the_default_session_gives_six_heartbeats_per_session() -> None:
    session = Settings().scheduler.session_timeout_ms
    assert session == 1500
    assert heartbeat_interval_ms(session) == 250


@pytest.mark.parametrize(
    ("asked", "bounds", "allowed"),
    [
        (1500, (6000, 1_800_000), 6000),  # a stock broker's minimum
        (1500, (1000, 1_800_000), 1500),  # allowed as it is
        (2_000_000, (6000, 1_800_000), 1_800_000),  # above the maximum
        (1500, None, KAFKA_MIN_SESSION_MS),  # bounds unread: Kafka's default minimum
        (9000, None, 9000),  # unread, and above that minimum: nothing better to try
    ],
)
def test_a_refused_session_timeout_falls_back_to_the_nearest_allowed(
    asked: int, bounds: tuple[int, int] | None, allowed: int
) -> None:
    assert allowed_session_ms(asked, bounds) == allowed


class _Refusing:
    """A consumer whose poll gives one error, as librdkafka reports a refused READ."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self, timeout: float) -> Any:
        error = KafkaError(self.code, "authorization failed")
        return SimpleNamespace(error=lambda: error)


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (KafkaError.GROUP_AUTHORIZATION_FAILED, "lacks READ on GROUP acme.scheduler "),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "lacks READ on TOPIC acme.scheduler-control "),
    ],
)
def test_a_read_the_acls_refuse_stops_the_scheduler_naming_what_it_lacks(
    code: int, says: str
) -> None:
    """It logged nothing above DEBUG and stood by for good: delayed jobs and cron never ran."""
    leadership = Leadership.__new__(Leadership)
    leadership._settings = Settings(namespace="acme")
    leadership._namespace = "acme"
    leadership.topic = scheduler_control_topic("acme")
    leadership._consumer = _Refusing(code)  # type: ignore[assignment]
    with pytest.raises(NotAuthorizedError) as raised:
        leadership.poll(0.0)
    assert says in str(raised.value)
    assert "--role scheduler" in str(raised.value)
