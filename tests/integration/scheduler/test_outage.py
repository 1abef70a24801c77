"""A broker outage and a namespace without topics, as a scheduler process sees and reports them."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline._settings import Settings

from ..worker.harness import wait_for
from ..worker.harness.metrics import free_port, health
from .conftest import SchedulerFactory

UNREACHABLE_FOR = re.compile(r"unreachable for (\d+)s")


@pytest.fixture
def factories(tmp_path: Path) -> Iterator[list[SchedulerFactory]]:
    made: list[SchedulerFactory] = []
    try:
        yield made
    finally:
        for factory in made:
            for process in factory.started:
                process.kill()


def test_an_unreachable_broker_is_one_log_line_and_healthz_503(
    namespace: str, tmp_path: Path, factories: list[SchedulerFactory]
) -> None:
    servers = f"127.0.0.1:{free_port()}"  # nothing listens there
    factory = SchedulerFactory(Settings(bootstrap_servers=servers, namespace=namespace), tmp_path)
    factories.append(factory)
    port = free_port()
    env = {"PIPELINE_SCHEDULER__METRICS_PORT": str(port)}
    scheduler = factory.start({**env, "PIPELINE_SCHEDULER__UNHEALTHY_AFTER_S": "2"})

    def down_for() -> int:
        answer = health(port)
        found = UNREACHABLE_FOR.search(answer[1]) if answer is not None else None
        return int(found.group(1)) if found is not None else -1

    assert wait_for(lambda: down_for() >= 5 or scheduler.process.poll() is not None, 60), (
        f"/healthz said {health(port)}\n{scheduler.output()}"
    )
    answer = health(port)
    assert answer is not None, scheduler.output()
    assert answer[0] == 503
    assert answer[1].startswith(f"standby: Kafka at {servers} unreachable for")
    assert "Connection refused" in answer[1]
    # Alive all the same: the liveness probe does not restart it for what a restart cannot mend.
    assert health(port, "/livez") == (200, "standby\n")
    lines = scheduler.output().splitlines()
    assert sum("unreachable since" in line for line in lines) == 1, scheduler.output()
    assert len(lines) <= 4, scheduler.output()


def test_a_namespace_without_topics_names_the_topic_and_the_fix(
    settings: Settings, tmp_path: Path, factories: list[SchedulerFactory]
) -> None:
    """The broker is up; the namespace's topics were never created."""
    factory = SchedulerFactory(settings, tmp_path)
    factories.append(factory)
    started = time.monotonic()
    scheduler = factory.start()
    assert scheduler.process.wait(30) == 1, scheduler.output()
    assert time.monotonic() - started < 15, scheduler.output()
    ns = settings.namespace
    output = scheduler.output()
    assert f"topic {ns}.scheduler-control does not exist" in output
    assert f"create the namespace's topics with `pipeline topics apply --namespace {ns}`" in output
    assert "Traceback" not in output
