"""Failure routing under repeated SIGKILLs (``make chaos``); the short version, two kills of
600 jobs, is in the default run (tests/integration/worker/test_failure_kills.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.integration.worker.failure_kills import run_failing_jobs_through_kills
from tests.integration.worker.failure_kills import settings as failure_settings

if TYPE_CHECKING:
    from tests.integration.worker.fixtures import WorkerKit

settings = failure_settings  # retry tiers of 0.5 s and 2 s for every test here


def test_repeated_sigkills_move_every_one_of_5000_failing_jobs_once(kit: WorkerKit) -> None:
    """Two workers, one of them SIGKILLed ten times while 5,000 jobs fail 0-4 times
    (max_attempts 3): each ends exactly once, succeeded or dead-lettered."""
    run_failing_jobs_through_kills(kit, jobs=5000, kills=10)
