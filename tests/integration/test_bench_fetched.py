"""``python -m ops.bench.fetched`` in a smoke size runs end to end and reports what the plain
consumer and each worker received (no rate or ratio is asserted: the machine decides those)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from .benchruns import run_benchmark

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.slow  # a fill, a plain read and two drains: make test-slow runs it


def test_the_fetch_benchmark_reports_what_each_reader_received(
    bootstrap_servers: str, tmp_path: Path
) -> None:
    jobs = 12_000
    text = run_benchmark(
        "ops.bench.fetched",
        "--jobs",
        str(jobs),
        "--rounds",
        "1",
        bootstrap_servers=bootstrap_servers,
        output=tmp_path / "benchmarks.md",
    )
    assert "## What a draining worker fetches" in text
    assert "`python -m ops.bench.fetched --jobs 12000 --rounds 1`" in text
    rows = re.findall(
        r"^\| (plain consumer, every job once|worker, prefetch before|worker, prefetch now) "
        r"\| ([\d.]+) MB \| [^|]+ \| ([\d,]+) \| ([\d.]+) \|",
        text,
        re.M,
    )
    assert [row[0] for row in rows] == [
        "plain consumer, every job once",
        "worker, prefetch before",
        "worker, prefetch now",
    ]
    plain_mb = float(rows[0][1])
    assert plain_mb > 0
    for _label, received_mb, messages, _per_job in rows:
        # librdkafka's own counts: every reader fetched every job at least once.
        assert int(messages.replace(",", "")) >= jobs
        assert float(received_mb) >= plain_mb
