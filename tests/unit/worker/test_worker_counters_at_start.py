"""Every registered type's counters exist from the worker's start, at 0.

A counter that first appears with a count in it shows Prometheus no increase: ``rate()`` and
``increase()`` start from its first sample. Made at a type's first job, the counts of the jobs
before the first scrape were unseen: five jobs failing at once at a start left the
failure-rate alert at NaN, and a type's first dead letter never showed.
"""

from __future__ import annotations

import asyncio

from pipeline import Pipeline
from pipeline.testing import InMemoryTransport

from .support import PRIORITIES, Harness


def test_the_counters_of_every_registered_type_start_at_zero() -> None:
    async def main() -> Harness:
        app = Pipeline(transport=InMemoryTransport())

        @app.job("report.build")
        def build() -> None:
            return None

        @app.job("email.send")
        async def send() -> None:
            return None

        return Harness(app)

    h = asyncio.run(main())
    metrics = h.metrics
    tiers = len(h.app.settings.topics.retry_delays_s)
    for job_type in ("report.build", "email.send"):
        for priority in PRIORITIES:
            stats = metrics.stats[(job_type, priority.value)]
            assert (stats.started, stats.succeeded, stats.failed) == (0, 0, 0)
        for tier in range(tiers):
            assert metrics.retries[(job_type, f"retry.{tier}")] == 0
        for reason in ("max_attempts", "fatal_error", "timeout", "validation_error"):
            assert metrics.dead_letters[(job_type, reason)] == 0
