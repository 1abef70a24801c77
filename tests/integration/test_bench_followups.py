"""``python -m ops.bench.followups`` in a smoke size runs end to end: the no-op jobs, and the
forwarding jobs with the worker before and the current one, each drained whole (no rate or
ratio is asserted: the machine decides those)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from .benchruns import run_benchmark

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow  # two fills and three drains, one by an older worker


def test_the_follow_up_benchmark_drains_each_kind_and_compares_them(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    text = run_benchmark(
        "ops.bench.followups",
        "--jobs",
        "3000",
        "--repeats",
        "1",
        bootstrap_servers=bootstrap_servers,
        output=tmp_path / "benchmarks.md",
    )
    assert "## Jobs that enqueue a job" in text
    assert "`python -m ops.bench.followups --jobs 3000 --repeats 1`" in text
    rows = re.findall(r"^\| (now|at \w+), `(bench\.\w+)` [^|]+\| ([\d,]+) \| (\d+)% \|", text, re.M)
    assert [(who, job) for who, job, _rate, _share in rows] == [
        ("now", "bench.noop"),
        ("at 5c7d0dc", "bench.forward"),
        ("now", "bench.forward"),
    ]
    assert rows[0][3] == "100"
    assert all(int(rate.replace(",", "")) > 0 for _who, _job, rate, _share in rows)
    assert re.search(r"now against before: \d+\.\d\d times the rate", text)
