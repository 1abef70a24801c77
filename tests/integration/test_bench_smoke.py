"""``python -m ops.bench --quick`` runs end to end and reports numbers (no timing is asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.kafka

DEFAULT_RUN_SECTIONS = ("enqueue", "drain", "latency", "processes")
"""The scheduler's section (half a minute of scheduler processes) has a slow test of its own."""


def quick_bench(bootstrap_servers: str, output: Path, *sections: str) -> str:
    """``python -m ops.bench --quick --only ...`` into ``output``; what it wrote."""
    result = subprocess.run(
        [sys.executable, "-m", "ops.bench", "--quick", "--output", str(output)]
        + [f"--only={section}" for section in sections],
        cwd=REPO_ROOT,
        env={**os.environ, "PIPELINE_BOOTSTRAP_SERVERS": bootstrap_servers},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return output.read_text()


def test_quick_benchmark_reports_every_section_with_numbers(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    published = REPO_ROOT / "docs" / "benchmarks.md"
    before = published.read_bytes() if published.exists() else None
    text = quick_bench(bootstrap_servers, tmp_path / "benchmarks.md", *DEFAULT_RUN_SECTIONS)

    for title in ("(a) Enqueue throughput", "(b) Drain throughput", "(c) Enqueue-to-start"):
        assert f"## {title}" in text, text
    # Every measured row has a positive rate, and every non-baseline row a ratio.
    rows = re.findall(r"^\| (.+?) \| ([\d,]+) \| ([\d.]+) \| ([\d,]+) \| (\S+) \|", text, re.M)
    assert len(rows) >= 7, text
    for label, jobs, seconds, rate, ratio in rows:
        assert int(jobs.replace(",", "")) > 0, label
        assert float(seconds) > 0, label
        assert int(rate.replace(",", "")) > 0, label
        assert ratio == "baseline" or re.fullmatch(r"\d+%", ratio), (label, ratio)
    # Latency: the pipeline and the raw round trip, each at the default linger and at 0.
    latency = re.findall(
        r"^\| (pipeline|raw) .+? \| ([\d.]+) \| ([\d,]+) \| [\d,]+ jobs/s \| ([\d.]+) ms "
        r"\| [\d.]+ ms \| ([\d.]+) ms \|",
        text,
        re.M,
    )
    assert sorted((side, linger) for side, linger, *_ in latency) == [
        ("pipeline", "0"),
        ("pipeline", "5"),
        ("raw", "0"),
        ("raw", "5"),
    ], text
    for _side, _linger, count, p50, p99 in latency:
        assert int(count.replace(",", "")) > 0
        assert float(p50) <= float(p99)
    # Worker processes: each handler drained by one process and by two, every job counted.
    processes = re.findall(
        r"^\| `(bench\.\w+)` .+? \| (\d) \| ([\d,]+) \| ([\d.]+)x \| ([\d,/ ]+) \|", text, re.M
    )
    assert sorted((job_type, n) for job_type, n, *_ in processes) == [
        ("bench.cpu", "1"),
        ("bench.cpu", "2"),
        ("bench.wait", "1"),
        ("bench.wait", "2"),
    ], text
    for _type, n, rate, _ratio, shares in processes:
        assert int(rate.replace(",", "")) > 0
        assert sum(int(s.replace(",", "")) for s in shares.split("/")) == 1_000
        assert len(shares.split("/")) <= int(n)
    assert "Date:" in text
    assert "nproc" in text
    # A quick run must not overwrite the published results, nor leak this machine's paths.
    assert (published.read_bytes() if published.exists() else None) == before
    assert str(tmp_path) not in text
    assert str(REPO_ROOT) not in text


@pytest.mark.slow
def test_quick_scheduler_benchmark_releases_every_job_and_reports_numbers(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    text = quick_bench(bootstrap_servers, tmp_path / "benchmarks.md", "scheduler")
    assert "## Scheduler" in text, text
    released = re.search(r"- Release throughput: ([\d,]+) jobs .* \*\*([\d,]+) jobs/s\*\*", text)
    assert released is not None, text
    assert int(released[1].replace(",", "")) == 10_000, text
    assert int(released[2].replace(",", "")) > 0
    late = re.search(r"- Lateness, idle .*: p50 ([\d.]+) ms, p99 ([\d.]+) ms", text)
    assert late is not None, text
    assert float(late[1]) <= float(late[2]), text
    assert re.search(r"- pending-24h: 20,000 jobs pending .* RSS \*\*\d+ MB\*\*", text), text
    clock = re.search(r"- Shortened clock .*: ([\d,]+) of ([\d,]+) jobs .* released", text)
    assert clock is not None, text
    assert clock[1] == clock[2] == "1,000", text
