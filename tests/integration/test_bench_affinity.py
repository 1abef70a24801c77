"""``python -m ops.bench.affinity`` drains one backlog with the decoding loop, a free worker and
a worker confined to one core, and writes its section with numbers (no timing is asserted)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from .benchruns import run_benchmark

pytestmark = pytest.mark.kafka


def test_a_short_run_writes_its_section_with_a_rate_for_each_reader(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    text = run_benchmark(
        "ops.bench.affinity",
        *("--jobs", "2000", "--repeats", "1"),
        bootstrap_servers=bootstrap_servers,
        output=tmp_path / "benchmarks.md",
    )
    assert "## One core per worker process" in text
    cpu = max(os.sched_getaffinity(0))
    rows = re.findall(r"^\| (.+?) \| 2,000 \| ([\d.]+) \| ([\d,]+) \| (\S+) \|", text, re.M)
    assert [label for label, *_ in rows] == [
        "raw consume loop + JobCodec.decode, first to last message",
        "pipeline-worker, every core, first to last job",
        f"pipeline-worker confined to core {cpu}, first to last job",
    ], text
    for label, seconds, rate, ratio in rows:
        assert float(seconds) > 0, label
        assert int(rate.replace(",", "")) > 0, label
        assert ratio == "baseline" or re.fullmatch(r"\d+%", ratio), (label, ratio)
    assert re.search(r"Confined against free: \d+\.\d\dx at the median\.", text), text
    assert str(tmp_path) not in text, "the command shown must not name this machine's paths"
