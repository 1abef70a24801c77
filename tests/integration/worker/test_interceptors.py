"""``pipeline-worker --app`` runs the interceptors of the application it loads."""

from __future__ import annotations

import re
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


def test_a_key_waits_for_the_thread_of_a_job_whose_interceptor_stopped_waiting_for_it(
    kit: WorkerKit, tmp_path: Path
) -> None:
    """The interceptor ends each job after 50 ms while its handler runs on its thread (until
    another job of the key starts beside it, or 300 ms pass): the job's key stays taken until the
    thread returns, so the key's runs never overlap."""
    ids = [
        kit.producer.enqueue("impatient", {"n": n, "ms": 300.0}, key="k", priority="default")
        for n in range(10)
    ]
    kit.producer.flush(60)
    launcher = WorkerLauncher(kit.settings, kit.recording.path, tmp_path, app=INTERCEPTED_APP)
    try:
        worker = launcher.start("--key-ordering", "--concurrency", "8", "--burst")
        assert worker.wait(timeout=120) == 0, worker.log_tail()
    finally:
        launcher.stop_all()

    kit.recording.refresh()
    runs = [e for e in kit.recording.events if e.job_type == "impatient" and e.kind in "SE"]
    # File order is write order: S E S E ... A burst run may exit before the thread of the last
    # job wrote its end (its offset was done when its interceptor gave up), and a job whose
    # interceptor gave up before a thread took it is not run at all (so a loaded machine may
    # run fewer than all).
    kinds = "".join(e.kind for e in runs)
    assert re.fullmatch("(SE)*S?", kinds), f"runs of one key overlapped: {kinds}"
    started = [e for e in runs if e.kind == "S"]
    assert len(started) >= 5, f"only {len(started)} of 10 ran: {worker.log_tail()}"
    assert {e.job_id for e in started} <= set(ids)
    assert [e.n for e in started] == sorted(e.n for e in started), "run out of order"
