"""``pipeline events tail`` when its Kafka goes away: it fails as unreachable after ``--timeout``
rather than waiting silently for ever (a private one-node cluster, stopped by the test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from confluent_kafka import Producer

from pipeline._admin import apply_topics
from pipeline._codec import EventCodec
from pipeline._records import Event, EventKind
from pipeline._settings import Settings

from ..waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline_cli.devbroker import DevCluster

pytestmark = pytest.mark.slow  # a private node of its own, stopped mid-test


def _event(job_id: str) -> Event:
    return Event(
        job_id=job_id,
        job_type="outage.test",
        kind=EventKind.RETRIED,
        attempt=1,
        priority="default",
        at=int(time.time() * 1000),
        worker="test",
    )


def test_a_tail_fails_as_unreachable_once_kafka_is_gone_for_its_timeout(
    dev_cluster_factory: Callable[..., DevCluster], namespace: str
) -> None:
    cluster = dev_cluster_factory(nodes=1)
    settings = Settings(bootstrap_servers=cluster.bootstrap_servers, namespace=namespace)
    apply_topics(settings)
    env = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": settings.bootstrap_servers,
        "PIPELINE_NAMESPACE": namespace,
    }
    command = [str(Path(sys.executable).parent / "pipeline"), "events", "tail", "--json"]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        tail = subprocess.Popen([*command, "--timeout", "3"], env=env, stdout=out, stderr=err)
        try:
            producer = Producer({**settings.client_config(), "log_level": 0})

            def printed() -> list[str]:
                out.seek(0)
                return [json.loads(line)["job_id"] for line in out.read().splitlines()]

            def following() -> bool:  # the tail starts at the end: send until one shows
                producer.produce(f"{namespace}.events", EventCodec().encode(_event("first")))
                producer.flush(5)
                return "first" in printed()

            assert wait_for(following, timeout=30, interval=0.5)
            cluster.stop_node(0, hard=True)
            assert wait_for(lambda: tail.poll() is not None, timeout=30), "tail still waits"
            err.seek(0)
            assert tail.returncode == 1, err.read()
            assert "did not answer within 3s" in err.read()
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.wait(10)
