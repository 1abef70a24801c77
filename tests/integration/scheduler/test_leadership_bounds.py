"""The brokers' bounds on the leadership group's session timeout, as the scheduler reads them
when its session timeout is refused (``pipeline_scheduler._leadership``)."""

from __future__ import annotations

from pipeline._settings import Settings
from pipeline_scheduler._leadership import allowed_session_ms, session_bounds_ms


def test_the_brokers_bounds_are_read_and_allow_the_default_session(settings: Settings) -> None:
    bounds = session_bounds_ms(settings)
    # The test brokers lower group.min.session.timeout.ms to 1,000 (Kafka's default: 6,000).
    assert bounds == (1000, 1_800_000)
    asked = settings.scheduler.session_timeout_ms
    assert allowed_session_ms(asked, bounds) == asked
