"""The public surface of ``pipeline_worker`` is what its ``__all__`` exports: this test pins it.

Everything else in the package (the stage subpackages included) is internal and may move. A
change here is a change to the contract (DESIGN section 9): add names deliberately, and never
remove or rename one without a deprecation in the changelog.
"""

from __future__ import annotations

import subprocess
import sys

import pipeline_worker

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
