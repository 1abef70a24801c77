"""Failing jobs moving through the retry tiers while a worker is SIGKILLed twice (the long
version, ten kills of 5,000 jobs, is in ``make chaos``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from .failure_kills import run_failing_jobs_through_kills
from .failure_kills import settings as failure_settings

if TYPE_CHECKING:
    from .fixtures import WorkerKit

settings = failure_settings  # retry tiers of 0.5 s and 2 s for every test here


@pytest.mark.slow
def test_two_sigkills_move_every_one_of_600_failing_jobs_once(kit: WorkerKit) -> None:
    run_failing_jobs_through_kills(kit, jobs=600, kills=2)
