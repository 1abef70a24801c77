"""``ops.bench.cycles``: the per-job figures it derives from a drain's loop turns and thread CPU
times."""

from __future__ import annotations

import pytest
from ops.bench.cycles import summarize
from ops.bench.report import without_output


def test_per_job_figures_come_from_the_window_between_the_snapshots() -> None:
    # Turns of 64 jobs every 1 ms: the pool runs 0.5 ms, hands back after 0.1 ms, the loop's
    # turn takes 0.2 ms, and the pool starts the next jobs 0.2 ms after the turn ended.
    turns = []
    for n in range(100):
        start = n * 0.001
        turns.append((start, start + 0.0005, start + 0.0006, start + 0.0008, 64))
    snaps = [
        (0.010, 640, {"MainThread": 1.0, "pool": 0.5, "pipeline-consumer": 0.1, "librdkafka": 0.0}),
        (0.090, 640 + 80 * 64, {"MainThread": 1.0 + 0.040, "pool": 0.5 + 0.020,
                                "pipeline-consumer": 0.1 + 0.005, "librdkafka": 0.002}),
    ]  # fmt: skip
    figures = summarize(turns, snaps, {"batches": 0.030, "turns": 0.008})
    jobs = 80 * 64
    assert figures["wall"] == pytest.approx(0.080 / jobs)
    assert figures["loop"] == pytest.approx(0.040 / jobs)
    assert figures["batches"] == pytest.approx(0.030 / jobs)
    assert figures["turns"] == pytest.approx(0.008 / jobs)
    assert figures["pool"] == pytest.approx(0.020 / jobs)
    assert figures["consumer"] == pytest.approx(0.005 / jobs)
    assert figures["librdkafka"] == pytest.approx(0.002 / jobs)
    assert figures["idle"] == pytest.approx((0.080 - 0.065) / jobs)
    assert figures["per_turn"] == 64
    assert figures["handoffs"] == pytest.approx((0.0002 + 0.0001) / 64)


def test_the_output_path_is_left_out_of_the_command_shown() -> None:
    assert without_output(["--jobs", "5", "--output", "/tmp/x.md", "--rounds", "1"]) == [
        "--jobs",
        "5",
        "--rounds",
        "1",
    ]
    assert without_output(["--output=/tmp/x.md", "--jobs", "5"]) == ["--jobs", "5"]
