"""The drain benchmark's baseline: an earlier commit's worker, importable from a temporary tree."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ops.bench.baseline import BaselineError, baseline_tree, resolve
from ops.bench.env import REPO_ROOT


def test_a_baseline_tree_runs_that_commits_worker_and_is_removed_afterwards() -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    with baseline_tree("HEAD") as baseline:
        root = baseline.root
        assert baseline.commit == head
        assert (root / "libs" / "pipeline" / "__init__.py").is_file()
        assert (root / "services" / "worker" / "pipeline_worker" / "__init__.py").is_file()
        assert (root / "schemas").is_dir()
        # A process given its environment imports the worker (and the bench app) from there.
        probe = (
            "import pipeline_worker, ops.bench.app as a\n"
            "print(pipeline_worker.__file__)\nprint(a.__file__)"
        )
        worker_file, app_file = subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, **baseline.environ()},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert worker_file.startswith(str(root))
        assert app_file.startswith(str(REPO_ROOT / "ops"))
    assert not root.exists()


def test_a_missing_baseline_commit_fails_saying_what_to_do() -> None:
    with pytest.raises(BaselineError, match=r"not in this clone.*--no-baseline"):
        resolve("0123456789abcdef0123456789abcdef01234567")
