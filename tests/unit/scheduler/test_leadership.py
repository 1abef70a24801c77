"""The leadership group's timings: the heartbeat that goes with a session timeout, and the
session timeout a scheduler falls back to when the brokers refuse the one it was given."""

from __future__ import annotations

import pytest

from pipeline import Settings
from pipeline_scheduler._leadership import (
    KAFKA_MIN_SESSION_MS,
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
