"""``python -m ops.bench.dlq_index`` with 2,000 dead letters runs end to end and reports numbers
(a smoke run: no timing is asserted)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .benchruns import REPO_ROOT, run_benchmark

if TYPE_CHECKING:
    from pathlib import Path


def test_the_dlq_index_benchmark_reports_every_step(bootstrap_servers: str, tmp_path: Path) -> None:
    published = REPO_ROOT / "docs" / "benchmarks.md"
    before = published.read_bytes() if published.exists() else None
    text = run_benchmark(
        "ops.bench.dlq_index",
        "--letters",
        "2000",
        bootstrap_servers=bootstrap_servers,
        output=tmp_path / "benchmarks.md",
    )
    assert "## Dead-letter index" in text
    assert "`python -m ops.bench.dlq_index --letters 2000`" in text
    steps = dict(
        re.findall(r"^\| (write|first refresh|refresh after|`get`)[^|]*\| ([\d.]+) \|", text, re.M)
    )
    assert set(steps) == {"write", "first refresh", "refresh after", "`get`"}, text
    assert "read and decode all 2,000 |" in text
    assert "refresh after 20 new letters and 20 discarded" in text
    queries = re.findall(r"^\| (.+?) \| ([\d,]*) \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
    assert len(queries) == 6, text
    for label, _matching, median, worst in queries:
        assert float(median) <= float(worst), label
    assert int(queries[0][1].replace(",", "")) == 2000  # pending: 2,020 less the 20 discarded
    assert re.search(r"the first refresh added \d+ MB to the resident set for 2,000 dead", text)
    assert re.search(r"of which the index holds \d+ MB", text)
    assert "Goal: every query under 2 s" in text
    assert (published.read_bytes() if published.exists() else None) == before
    assert str(tmp_path) not in text
