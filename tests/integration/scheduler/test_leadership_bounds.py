"""The brokers' bounds on the leadership group's session timeout, as the scheduler reads them
when its session timeout is refused (``pipeline_scheduler._leadership``), and a membership
Kafka ends for good."""

from __future__ import annotations

import json

from pipeline._settings import Settings
from pipeline_scheduler._leadership import allowed_session_ms, session_bounds_ms
from tests.waiting import wait_for

from .conftest import SchedulerFactory


def test_the_brokers_bounds_are_read_and_allow_the_default_session(settings: Settings) -> None:
    bounds = session_bounds_ms(settings)
    # The test brokers lower group.min.session.timeout.ms to 1,000 (Kafka's default: 6,000).
    assert bounds == (1000, 1_800_000)
    asked = settings.scheduler.session_timeout_ms
    assert allowed_session_ms(asked, bounds) == asked


def test_a_scheduler_whose_membership_kafka_ends_for_good_exits(
    schedulers: SchedulerFactory,
) -> None:
    """Two schedulers given one static member id: Kafka fences one for good. It exits saying
    why, instead of standing by for ever without a chance to lead."""
    env = {"PIPELINE_KAFKA": json.dumps({"group.instance.id": f"{schedulers.settings.namespace}"})}
    processes = [schedulers.start(env) for _ in range(2)]
    assert wait_for(lambda: any(p.process.poll() is not None for p in processes), 60), "\n".join(
        p.output()[-2000:] for p in processes
    )
    [ended] = [p for p in processes if p.process.poll() is not None]
    assert ended.process.returncode == 1, ended.output()[-3000:]
    assert "membership of its group for good" in ended.output(), ended.output()[-3000:]
