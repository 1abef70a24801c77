"""``python -m ops.bench.tenants`` with a small flood runs end to end and reports B's waits for
each worker (a smoke run: no timing is asserted)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from .benchruns import run_benchmark

if TYPE_CHECKING:
    from pathlib import Path


def test_the_tenant_benchmark_reports_waits_with_and_without_fairness(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    text = run_benchmark(
        "ops.bench.tenants",
        "--flood",
        "1500",
        "--late",
        "60",
        "--wide-buffer",
        "4000",
        bootstrap_servers=bootstrap_servers,
        output=tmp_path / "benchmarks.md",
    )
    assert "## Tenant fairness" in text
    assert "`python -m ops.bench.tenants --flood 1500 --late 60 --wide-buffer 4000`" in text
    rows = re.findall(
        r"^\| (read order \(fairness off\)|fair, default look-ahead|fair, wide look-ahead) "
        r"\| ([\d,]+) \([\d,]+\) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d,]+) \| ([\d,]+) ",
        text,
        re.M,
    )
    assert [row[0] for row in rows] == [
        "read order (fairness off)",
        "fair, default look-ahead",
        "fair, wide look-ahead",
    ], text
    assert rows[2][1] == "4,000"
    for _label, _buffer, p50, p99, worst, backlog, _during in rows:
        assert float(p50) <= float(p99) <= float(worst)
        assert int(backlog.replace(",", "")) <= 1500
    assert str(tmp_path) not in text
