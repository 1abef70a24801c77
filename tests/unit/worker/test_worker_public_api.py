"""The public surface of ``pipeline_worker`` is what its ``__all__`` exports: this test pins it.

Everything else in the package (the stage subpackages included) is internal and may move. A
change here is a change to the contract (DESIGN section 9): add names deliberately, and never
remove or rename one without a deprecation in the changelog.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

import pipeline_worker
from pipeline import Pipeline, Priority, Settings
from pipeline_worker._work import PartitionState

PUBLIC = {
    "Middleware",
    "Outcome",
    "OutcomeKind",
    "PartitionRef",
    "TimeLimitError",
    "Worker",
    "main",
}


def test_all_is_pinned() -> None:
    assert set(pipeline_worker.__all__) == PUBLIC
    assert len(pipeline_worker.__all__) == len(PUBLIC), "no duplicates in __all__"


def test_every_exported_name_exists() -> None:
    for name in pipeline_worker.__all__:
        assert getattr(pipeline_worker, name) is not None, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    assert not hasattr(pipeline_worker, "Processor")


def test_the_exports_are_the_classes_the_worker_uses() -> None:
    from pipeline import TimeLimitError
    from pipeline_worker._middleware import Middleware
    from pipeline_worker._runtime import Worker
    from pipeline_worker.route.outcome import Outcome, OutcomeKind, PartitionRef

    assert pipeline_worker.Worker is Worker
    assert pipeline_worker.Middleware is Middleware
    assert pipeline_worker.Outcome is Outcome
    assert pipeline_worker.OutcomeKind is OutcomeKind
    assert pipeline_worker.PartitionRef is PartitionRef
    assert pipeline_worker.TimeLimitError is TimeLimitError


def test_python_m_pipeline_worker_runs_the_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline_worker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: pipeline-worker" in result.stdout


class PerJobHooksOnly:
    """Not a Middleware subclass: only the two hooks the job path calls."""

    def on_progress(self, context: object, fraction: float, detail: str | None) -> None:
        pass

    def on_outcome(self, outcome: object) -> None:
        return None


class Assignments(pipeline_worker.Middleware):
    def __init__(self) -> None:
        self.assigned: list[list[pipeline_worker.PartitionRef]] = []

    def on_partitions_assigned(
        self, worker: pipeline_worker.Worker, partitions: Sequence[pipeline_worker.PartitionRef]
    ) -> None:
        self.assigned.append(list(partitions))


def test_a_middleware_with_only_the_per_job_hooks_is_not_a_failing_lifecycle_hook() -> None:
    full = Assignments()
    worker = pipeline_worker.Worker(
        Pipeline(Settings(namespace="acme")), middleware=[PerJobHooksOnly(), full]
    )
    worker.on_assigned([PartitionState("acme.jobs.default", 3, Priority.DEFAULT, 2)])
    assert full.assigned == [[pipeline_worker.PartitionRef("acme.jobs.default", 3)]]
    assert worker.metrics.hook_failures == 0
