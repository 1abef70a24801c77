"""After a failed read the exporter serves the last successful read's values: its oldest-job
ages too, as they were then. Recomputed at every scrape, a job that was running at that read
looked older and older (``PipelineOldestJobTooOld`` fired while the workers drained)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pipeline_cli._exporter import BacklogCollector, ExporterState

from .metrics_exported import backlog

AGE_AT_READ_S = 9.0
"""The oldest job of :func:`backlog` was written at 1 s, read at 10 s."""


def _age(*, ok: bool, now: float) -> float | None:
    state = ExporterState()
    state.read = (backlog(), True)
    state.ok = ok
    registry = CollectorRegistry()
    registry.register(BacklogCollector(state, clock=lambda: now))
    return registry.get_sample_value(
        "pipeline_queue_oldest_job_age_seconds", {"priority": "default"}
    )


def test_the_ages_of_a_good_read_grow_until_the_next_read() -> None:
    assert _age(ok=True, now=backlog().read_at + 60) == AGE_AT_READ_S + 60


def test_after_a_failed_read_the_ages_are_those_of_the_last_good_read() -> None:
    read_at = backlog().read_at
    assert [_age(ok=False, now=read_at + later) for later in (1, 300, 660)] == [AGE_AT_READ_S] * 3
