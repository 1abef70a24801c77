"""``python -m ops.bench.web_pages`` with 500 dead letters runs end to end in Chromium and
reports every page (a smoke run: no timing is asserted)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .benchruns import run_benchmark

if TYPE_CHECKING:
    from pathlib import Path


def test_the_dashboard_benchmark_times_every_page(bootstrap_servers: str, tmp_path: Path) -> None:
    text = run_benchmark(
        "ops.bench.web_pages",
        "--letters",
        "500",
        bootstrap_servers=bootstrap_servers,
        output=tmp_path / "benchmarks.md",
    )
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
