"""``pipeline-worker --app`` runs the interceptors of the application it loads."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from .harness import WorkerLauncher, check_ran, enqueue

if TYPE_CHECKING:
    from pathlib import Path

    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

INTERCEPTED_APP = "tests.integration.worker.apps.intercepted:app"


def test_the_worker_runs_the_interceptors_registered_on_its_app(
    kit: WorkerKit, tmp_path: Path
) -> None:
    ids = enqueue(kit.producer, "noop", 5, tenant="acme")
    ids += enqueue(kit.producer, "noop_async", 5, first=5)
    launcher = WorkerLauncher(kit.settings, kit.recording.path, tmp_path, app=INTERCEPTED_APP)
    try:
        worker = launcher.start("--burst")
        assert worker.wait(timeout=120) == 0, worker.log_tail()
    finally:
        launcher.stop_all()

    assert check_ran(kit.recording, ids, exactly_once=True) == []
    by_job: dict[str, list[tuple[str, str]]] = {}
    for event in kit.recording.events:
        by_job.setdefault(event.job_id, []).append((event.kind, event.job_type))
    for job_id in ids[:5]:
        assert by_job[job_id] == [("I", "noop@acme"), ("S", "noop"), ("E", "noop"), ("O", "noop")]
    for job_id in ids[5:]:
        assert by_job[job_id] == [
            ("I", "noop_async@None"),
            ("S", "noop_async"),
            ("E", "noop_async"),
            ("O", "noop_async"),
        ]
