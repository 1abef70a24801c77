"""The per-job path stays short: Python calls per no-op job, counted, not timed.

``python -m ops.bench.job_objects`` reports the same count next to objects allocated and time,
for the code before the worker's stage packages and now; this test keeps the count from
growing back. Before the stage packages a no-op job with an annotated payload cost about 26
Python calls (decoding, three calls to start it, a pydantic model built and taken apart, the
completion); now about 18.
"""

from __future__ import annotations

from ops.bench.job_objects import calls_per_job

BUDGET = 20.0
"""Python calls per job at most; the path takes about 18 (a few more per batch: pumping)."""


def test_a_no_op_job_costs_at_most_twenty_python_calls_on_its_path() -> None:
    python, c = calls_per_job(jobs=3000, warmup=500)
    assert python <= BUDGET, f"{python:.1f} Python calls per job (budget {BUDGET})"
    assert c > 0, "the hook counted the C calls too"
