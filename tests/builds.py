"""Builds of the non-Python programs the tests run (the Java and Go producers), when stale."""

from __future__ import annotations

import shutil
import subprocess
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

BUILD_TIMEOUT_S = 900
"""Long enough for a first build that downloads its dependencies."""


def stale(output: Path, sources: list[Path]) -> bool:
    """Whether ``output`` is missing or older than one of ``sources``."""
    if not output.exists():
        return True
    built = output.stat().st_mtime
    return any(source.stat().st_mtime > built for source in sources)


def run_tool(command: list[str], cwd: Path, timeout: float = BUILD_TIMEOUT_S) -> str:
    """Runs ``command`` (its tool looked up on PATH) and returns its output; fails the test with
    the tool's output if it fails."""
    tool = shutil.which(command[0])
    assert tool is not None, f"{command[0]} is required (.ci/run checks for it)"
    result = subprocess.run(
        [tool, *command[1:]], cwd=cwd, capture_output=True, timeout=timeout, check=False
    )
    output = (result.stdout + result.stderr).decode(errors="replace")
    assert result.returncode == 0, f"{' '.join(command)} failed in {cwd.name}:\n{output[-4000:]}"
    return result.stdout.decode()


def build(output: Path, sources: list[Path], command: list[str], cwd: Path) -> Path:
    """``output``, rebuilt by ``command`` in ``cwd`` when it is stale."""
    if stale(output, sources):
        run_tool(command, cwd)
    return output
