"""``ops.bench.affinity``: a worker started in :func:`confined` runs on the one core it names,
and the section reports each worker against the decoding loop."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ops.bench.affinity import confined, one_core, section

_SHOW = "import os; print(sorted(os.sched_getaffinity(0)))"


def _child_cores() -> list[int]:
    result = subprocess.run(
        [sys.executable, "-c", _SHOW], capture_output=True, text=True, check=True
    )
    return [int(n) for n in result.stdout.strip("[]\n").split(",")]


def test_a_process_started_while_confined_runs_on_that_core_alone() -> None:
    # one_core() refuses a machine of one core (tested below): the suite needs two.
    allowed = sorted(os.sched_getaffinity(0))
    cpu = one_core()
    assert cpu == allowed[-1]
    with confined(cpu):
        inside = _child_cores()
    assert inside == [cpu]
    # The benchmark itself, and what it starts afterwards, may use every core again.
    assert sorted(os.sched_getaffinity(0)) == allowed
    assert _child_cores() == allowed
    with confined(None):
        assert _child_cores() == allowed


def test_one_core_refuses_a_process_that_may_use_one_core_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {3})
    with pytest.raises(SystemExit, match="may run on 1 core"):
        one_core()


def test_the_section_sets_each_worker_against_the_decoding_loop() -> None:
    jobs = 1_000
    # (wall, first-to-last) seconds: the decoding loop at 100,000 jobs/s, the free worker at
    # 40,000 and the confined one at 50,000 in their median runs.
    runs = {
        "decode": [(1.0, 0.011), (1.0, 0.010), (1.0, 0.009)],
        "free": [(1.0, 0.030), (1.0, 0.025), (1.0, 0.020)],
        "confined": [(1.0, 0.019), (1.0, 0.020), (1.0, 0.021)],
    }
    text = section(jobs, 3, 1, runs).markdown()
    assert (
        "| pipeline-worker, every core, first to last job | 1,000 | 0.025 | 40,000 | 40% |" in text
    )
    assert (
        "| pipeline-worker confined to core 1, first to last job | 1,000 | 0.020 | 50,000 | 50% |"
        in text
    )
    assert "`taskset -c 1 pipeline-worker " in text
    assert "Confined against free: 1.25x at the median." in text
    assert "free, ≥ 50% of the decoding loop (40%): **not met**" in text
    assert "confined, ≥ 50% of the decoding loop (50%): met" in text
