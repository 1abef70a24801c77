"""Workers joining and leaving during a run: nothing lost, nothing repeated, no early commit."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from .harness import CommitAuditor, auditing, check_ran
from .scenarios import run_churn

if TYPE_CHECKING:
    from .fixtures import WorkerKit

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_two_then_three_workers_joining_and_leaving_lose_and_repeat_nothing(
    kit: WorkerKit,
) -> None:
    job_topics = kit.topics.all_jobs()
    with auditing(CommitAuditor(kit.offsets, kit.recording, job_topics)) as auditor:
        result = run_churn(
            kit,
            jobs=10_000,
            rate=400,
            phases=[(2, 12.0), (3, 12.0)],
            period=3.0,
            worker_args=["--concurrency", "20"],
            fields={"min_ms": 5.0, "max_ms": 20.0},
        )

    assert result.joins >= 6, result
    assert result.leaves >= 3, result
    assert set(result.exit_codes) == {0}, result.exit_codes
    # Every stop was a graceful SIGTERM, whose revocation commits what finished: so no job may
    # run twice, and none may be lost.
    assert check_ran(kit.recording, result.ids, exactly_once=True) == []
    assert kit.offsets.lag(job_topics) == {}
    auditor.assert_clean()
    pids = {e.pid for e in kit.recording.starts()}
    assert len(pids) >= 4, f"only {len(pids)} workers ran jobs: the churn moved no partitions"
