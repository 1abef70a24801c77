"""Failure routing under repeated SIGKILLs (``make chaos``).

Known problem: in about half the runs, after the kills one partition of ``<ns>.jobs.default``
stops being consumed (its lag stays, no worker thread is blocked); no job was seen lost or moved
twice in the runs that finished. Not diagnosed yet, hence not in the default run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from .failure_kills import run_failing_jobs_through_kills
from .failure_kills import settings as failure_settings

if TYPE_CHECKING:
    from tests.integration.worker.fixtures import WorkerKit

pytestmark = pytest.mark.kafka

settings = failure_settings  # retry tiers of 0.5 s and 2 s for every test here


def test_two_sigkills_move_every_one_of_600_failing_jobs_once(kit: WorkerKit) -> None:
    run_failing_jobs_through_kills(kit, jobs=600, kills=2)


def test_repeated_sigkills_move_every_one_of_5000_failing_jobs_once(kit: WorkerKit) -> None:
    """Two workers, one of them SIGKILLed ten times while 5,000 jobs fail 0-4 times
    (max_attempts 3): each ends exactly once, succeeded or dead-lettered."""
    run_failing_jobs_through_kills(kit, jobs=5000, kills=10)
