"""The code of an earlier commit, runnable next to the current one on the same broker.

``baseline_tree("8a849e9")`` writes that commit's ``libs``, ``services`` and ``schemas`` into a
temporary directory (``git archive``, so the work tree and the index are never touched) and
yields the import roots that make its ``pipeline`` and ``pipeline_worker`` the ones a process
imports: put them first on ``PYTHONPATH`` and the same virtual environment runs the old code
(the editable install's roots come after ``PYTHONPATH``). The bench application
(``ops.bench.app``) stays the current one, so both runs call the same handlers.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .env import REPO_ROOT

if TYPE_CHECKING:
    from collections.abc import Iterator

DEFAULT_REF = "8a849e9"
"""The worker before it was split into stage packages (the parent of that change)."""
TREES = ("libs", "services", "schemas")
"""What a worker of another commit needs: the library, the services, the wire schemas."""
SOURCE_ROOTS = ("libs", "services/worker", "services/scheduler", "services/cli")
"""The import roots, as the editable install lists them (pyproject's wheel packages)."""


class BaselineError(RuntimeError):
    """The baseline commit cannot be read from this clone."""


@dataclass(frozen=True)
class Baseline:
    """The code of ``ref`` written out at ``root``; ``pythonpath`` imports it first."""

    ref: str
    commit: str
    root: Path

    @property
    def pythonpath(self) -> list[Path]:
        return [self.root / name for name in SOURCE_ROOTS if (self.root / name).is_dir()]

    def environ(self) -> dict[str, str]:
        """``PYTHONPATH`` for a process that must run this code (the bench app stays ours)."""
        paths = [*map(str, self.pythonpath), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
        return {"PYTHONPATH": os.pathsep.join(filter(None, paths))}

    def check_imports(self) -> None:
        """Fail unless a process with :meth:`environ` imports the worker from this tree."""
        probe = "import pipeline, pipeline_worker as w\nprint(pipeline.__file__, w.__file__)"
        result = subprocess.run(
            [sys.executable, "-c", probe],
            env={**os.environ, **self.environ()},
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        files = result.stdout.split()
        if result.returncode != 0 or len(files) != 2:
            raise BaselineError(
                f"the code of {self.ref} does not import in this environment:\n"
                f"{result.stderr[-2000:]}"
            )
        for file in files:
            if not Path(file).resolve().is_relative_to(self.root.resolve()):
                raise BaselineError(
                    f"the baseline run would import {file}, not the code of {self.ref}: "
                    "is the package installed non-editable into this environment? "
                    "Reinstall it with `make setup` (an editable install) or pass --no-baseline"
                )


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, check=False)


def resolve(ref: str) -> str:
    """The full commit id of ``ref``; :class:`BaselineError` saying what to do if it is missing."""
    try:
        found = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except FileNotFoundError as exc:
        raise BaselineError(
            f"git is not installed: it is needed to read the baseline {ref}; "
            "install git or pass --no-baseline"
        ) from exc
    if found.returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.strip() == b"true"
        hint = (
            "this clone is shallow: fetch the history (`git fetch --unshallow`)"
            if shallow
            else "fetch it (`git fetch origin`), or name another commit with --baseline-ref"
        )
        raise BaselineError(
            f"the baseline commit {ref!r} is not in this clone; {hint}, "
            "or skip the comparison with --no-baseline"
        )
    return found.stdout.decode().strip()


@contextlib.contextmanager
def baseline_tree(ref: str = DEFAULT_REF) -> Iterator[Baseline]:
    """The code of ``ref`` in a temporary directory (removed afterwards); see the module doc."""
    commit = resolve(ref)
    archive = _git("archive", "--format=tar", commit, *TREES)
    if archive.returncode != 0:
        raise BaselineError(
            f"git archive of {ref} ({commit[:12]}) failed: {archive.stderr.decode().strip()}"
        )
    with tempfile.TemporaryDirectory(prefix="pipeline-baseline-") as tmp:
        root = Path(tmp)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(root, filter="data")
            else:  # Python before 3.11.4; the archive is git's own
                tar.extractall(root)
        baseline = Baseline(ref, commit, root)
        baseline.check_imports()
        yield baseline
