"""Fixtures for worker tests, shared by ``tests/integration/worker`` and ``tests/chaos``.

They build on the fixtures of ``tests/conftest.py``: a real broker, and per test a unique
namespace with its :class:`~pipeline.Settings`. A test asks for ``kit`` and gets all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline._topics import TopicNames

from ..scheduler.conftest import SchedulerFactory
from .harness import GroupOffsets, Recording, WorkerLauncher

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def with_retry_tiers(bootstrap_servers: str, namespace: str, delays: list[float]) -> Settings:
    """Settings of a three-partition namespace whose retry tiers wait ``delays`` seconds
    (a test module overrides its ``settings`` fixture with these to see retries quickly)."""
    return Settings(
        bootstrap_servers=bootstrap_servers,
        namespace=namespace,
        topics={"partitions": 3, "retry_delays_s": delays},
    )


@dataclass(frozen=True)
class WorkerKit:
    """Everything a worker test uses, for one namespace whose topics exist."""

    settings: Settings
    topics: TopicNames
    workers: WorkerLauncher
    """Starts workers on the recording app; any still running are killed at teardown."""
    producer: Pipeline
    """Enqueues jobs (it has no handlers: the workers have those)."""
    offsets: GroupOffsets
    recording: Recording


@pytest.fixture
def kit(settings: Settings, tmp_path: Path) -> Iterator[WorkerKit]:
    apply_topics(settings)
    recording = Recording(tmp_path / "runs.log")
    launcher = WorkerLauncher(settings, recording.path, tmp_path)
    producer = Pipeline(settings)
    offsets = GroupOffsets(settings)
    try:
        yield WorkerKit(
            settings, TopicNames(settings.namespace), launcher, producer, offsets, recording
        )
    finally:
        launcher.stop_all()
        offsets.close()
        producer.close(30)


@pytest.fixture
def schedulers(kit: WorkerKit, tmp_path: Path) -> Iterator[SchedulerFactory]:
    """Starts ``pipeline-scheduler`` processes in the kit's namespace; killed at teardown."""
    factory = SchedulerFactory(kit.settings, tmp_path)
    try:
        yield factory
    finally:
        for process in factory.started:
            process.kill()
