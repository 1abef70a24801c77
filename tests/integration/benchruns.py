"""Running one benchmark script in a smoke size, for the tests that check its report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXISTING = "# Benchmarks\n\nA header.\n\n## Another section\n\nKept.\n"
"""A results file the run must keep the rest of: its header and a section it does not measure."""


def run_benchmark(module: str, *args: str, bootstrap_servers: str, output: Path) -> str:
    """Run ``python -m module *args --output output`` against ``bootstrap_servers``, with
    ``output`` holding :data:`EXISTING` first; the file's text afterwards (the run must
    succeed and keep what was there)."""
    output.write_text(EXISTING)
    result = subprocess.run(
        [sys.executable, "-m", module, *args, "--output", str(output)],
        cwd=REPO_ROOT,
        env={**os.environ, "PIPELINE_BOOTSTRAP_SERVERS": bootstrap_servers},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    text = output.read_text()
    assert text.startswith("# Benchmarks\n\nA header.\n"), text
    assert "## Another section\n\nKept." in text
    return text
