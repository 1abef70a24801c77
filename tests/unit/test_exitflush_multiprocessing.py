"""The exit flush of a :mod:`multiprocessing` child that imports the package only once it runs.

Such a child (``fork`` from a parent that never imported it, ``forkserver``, ``spawn``) has run
multiprocessing's after-fork functions before the package existed in it; ``fork`` and
``forkserver`` children end with ``os._exit()``, which runs no atexit function. Their jobs were
neither flushed nor reported. Each scenario runs in an interpreter of its own, against an
address where no broker listens, with a short exit flush: the child must report its job.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.process
import multiprocessing.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipeline import _exitflush

NOWHERE = "127.0.0.1:1"

SCRIPT = """
import multiprocessing, os, sys


def task():
    from pipeline import Pipeline  # the child's first import of the package

    app = Pipeline()
    os.write(1, (app.enqueue("report.build", {"n": 1}) + "\\n").encode())


if __name__ == "__main__":
    method, kind, preimport = sys.argv[1:]
    if preimport == "yes":
        import pipeline  # noqa: F401
    context = multiprocessing.get_context(method)
    if kind == "process":
        child = context.Process(target=task)
        child.start()
        child.join(60)
        if child.exitcode is None:
            child.kill()
            sys.exit("the child did not end within 60s")
        sys.exit(child.exitcode)
    pool = context.Pool(1)
    pool.apply_async(task).get(60)
    pool.close()
    pool.join()  # the worker ends as a Process does, through its finalizers
    if preimport != "yes" and "pipeline" in sys.modules:
        sys.exit("the parent imported the package")
"""


def _run(
    tmp_path: Path, method: str, kind: str, preimport: bool
) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "lazy_child.py"  # a file: spawn and forkserver children import it
    script.write_text(SCRIPT)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")},
        "PIPELINE_BOOTSTRAP_SERVERS": NOWHERE,
        "PIPELINE_PRODUCER__EXIT_FLUSH_TIMEOUT_S": "0.5",
    }
    return subprocess.run(
        [sys.executable, str(script), method, kind, "yes" if preimport else "no"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("method", "kind", "preimport"),
    [
        ("fork", "process", False),
        ("forkserver", "process", False),
        ("spawn", "process", False),
        ("forkserver", "pool", False),
        ("fork", "process", True),  # the after-fork hook's case, reported once as before
    ],
)
def test_a_child_that_imports_the_package_itself_reports_its_lost_job(
    tmp_path: Path, method: str, kind: str, preimport: bool
) -> None:
    result = _run(tmp_path, method, kind, preimport)
    assert result.returncode == 0, result.stderr
    [job_id] = result.stdout.split()
    reports = [line for line in result.stderr.splitlines() if "never reached Kafka" in line]
    assert len(reports) == 1, result.stderr  # flushed once, though atexit may run too (spawn)
    [report] = reports
    assert report.startswith(f"1 enqueued job(s) never reached Kafka at {NOWHERE} and are lost")
    assert "still unacknowledged 0.5s after exit began" in report
    assert job_id in report


def test_the_finalizer_is_registered_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import-time hook and the after-fork hook may both ask in one child: one finalizer."""
    registered: list[tuple[Any, ...]] = []

    def finalize(obj: object, callback: object, *, exitpriority: int) -> None:
        registered.append((obj, callback, exitpriority))

    monkeypatch.setattr(multiprocessing.util, "Finalize", finalize)
    monkeypatch.setattr(multiprocessing.process, "_parent_process", object())
    monkeypatch.setattr(_exitflush, "_finalized_in", None)
    _exitflush._hook_this_child()
    _exitflush._hook_this_child()
    _exitflush._flush_when_the_child_ends(_exitflush.flush_all)
    assert registered == [(None, _exitflush.flush_all, _exitflush._EXIT_PRIORITY)]
    # Not a multiprocessing child: the atexit function is enough, nothing is registered.
    monkeypatch.setattr(multiprocessing.process, "_parent_process", None)
    monkeypatch.setattr(_exitflush, "_finalized_in", None)
    registered.clear()
    _exitflush._hook_this_child()
    assert registered == []
    assert multiprocessing.parent_process() is None
