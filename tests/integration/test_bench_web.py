"""``python -m ops.bench.web_pages`` with 500 dead letters runs end to end in Chromium and
reports every page (a smoke run: no timing is asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_dashboard_benchmark_times_every_page(bootstrap_servers: str, tmp_path: Path) -> None:
    output = tmp_path / "benchmarks.md"
    output.write_text("# Benchmarks\n\n## Another section\n\nKept.\n")
    result = subprocess.run(
        [sys.executable, "-m", "ops.bench.web_pages", "--letters", "500", "--output", str(output)],
        cwd=REPO_ROOT,
        env={**os.environ, "PIPELINE_BOOTSTRAP_SERVERS": bootstrap_servers},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    text = output.read_text()
    assert "## Another section\n\nKept." in text
    assert "## Dashboard" in text
    assert "`python -m ops.bench.web_pages --letters 500`" in text
    rows = re.findall(r"^\| ((?:overview|dead letters:)[^|]*?) \| ([\d.]+) \|", text, re.M)
    assert [label for label, _ in rows][:2] == [
        "overview (median of 7)",
        "dead letters: first screen (pending, newest first)",
    ], text
    assert len(rows) == 8, text
    assert all(float(seconds) > 0 for _, seconds in rows)
    assert "first index refresh of the 500 letters" in text
    assert "Goal: overview under 0.5 s" in text
    assert str(tmp_path) not in text
