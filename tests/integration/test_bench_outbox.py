"""``python -m ops.bench.outbox`` with 2,000 jobs runs end to end and reports every line (a smoke
run: no timing is asserted)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .benchruns import REPO_ROOT, run_benchmark

if TYPE_CHECKING:
    from pathlib import Path


def test_the_outbox_benchmark_reports_both_databases(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    published = REPO_ROOT / "docs" / "benchmarks.md"
    before = published.read_bytes() if published.exists() else None
    text = run_benchmark(
        "ops.bench.outbox",
        "--jobs",
        "2000",
        "--batch-size",
        "100",
        bootstrap_servers=bootstrap_servers,
        output=tmp_path / "benchmarks.md",
    )
    assert "## Transactional outbox" in text
    lines = re.findall(r"^\| (.+?) \| 2,000 \| ([\d.]+) \| ([\d,]+) \| (\w+%?) \|", text, re.M)
    labels = [label for label, *_ in lines]
    assert len(lines) == 7, text
    assert labels[0].startswith("`app.enqueue`")
    assert [label.split(":")[0] for label in labels[1:]] == ["PostgreSQL"] * 3 + ["SQLite"] * 3
    assert sum("rows relayed" in label for label in labels) == 2
    assert lines[0][3] == "baseline"
    assert all(ratio.endswith("%") for *_, ratio in lines[1:])
    assert "`python -m ops.bench.outbox --jobs 2000 --batch-size 100`" in text
    assert (published.read_bytes() if published.exists() else None) == before
    assert str(tmp_path) not in text
