"""Every scenario runs twice: on the stub worker (``stub``) and on a real worker (``kafka``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline.testing import InMemoryTransport

from .app import make_app
from .harness import PARTITIONS
from .kafkaside import KafkaHarness, start_kafka_harness
from .stubside import StubHarness

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pipeline.testing.plugin import StubFactory

    from .harness import Harness


@pytest.fixture(scope="module")
def kafka_harness(
    bootstrap_servers: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaHarness]:
    """One worker and one scheduler for the module's scenarios, in a namespace of their own
    (stopped after the module, so they take no CPU from the rest of the test run)."""
    harness = start_kafka_harness(bootstrap_servers, tmp_path_factory.mktemp("behaviour"))
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture
def stub_harness(tmp_path: Path, pipeline_stub: StubFactory) -> Iterator[StubHarness]:
    """A fresh application on a stub worker of the kit's pytest plugin, on a fake clock."""
    settings = Settings(topics={"partitions": PARTITIONS})
    worker = pipeline_stub(make_app(settings, transport=InMemoryTransport()))
    with StubHarness(tmp_path / "calls.log", worker).recording() as harness:
        yield harness


@pytest.fixture(params=["stub", pytest.param("kafka", marks=pytest.mark.kafka)])
def harness(request: pytest.FixtureRequest) -> Harness:
    harness: Harness = request.getfixturevalue(f"{request.param}_harness")
    return harness
