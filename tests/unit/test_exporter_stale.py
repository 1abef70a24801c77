"""After a failed read the exporter serves the last successful read's values: its oldest-job
ages too, as they were then. Recomputed at every scrape, a job that was running at that read
looked older and older (``PipelineOldestJobTooOld`` fired while the workers drained)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from pipeline._backlogmodel import Backlog, GroupMembers, PartitionBacklog, TopicBacklog
from pipeline._deadletters import DlqStats
from pipeline_cli._exporter import BacklogCollector, ExporterState

READ_AT = 1_000.0
ENQUEUED_MS = 995_000
"""5 s before the read."""


def _age(state: ExporterState, now: float) -> float | None:
    registry = CollectorRegistry()
    registry.register(BacklogCollector(state, clock=lambda: now))
    return registry.get_sample_value(
        "pipeline_queue_oldest_job_age_seconds", {"priority": "default"}
    )


def _state(*, ok: bool) -> ExporterState:
    topic = TopicBacklog(
        "ns.jobs.default", "ns.workers", (PartitionBacklog(0, 0, 5, 2, ENQUEUED_MS),)
    )
    state = ExporterState()
    state.backlog = Backlog(
        read_at=READ_AT,
        jobs={"default": topic},
        retries=(),
        deferred=(),
        dead_letters=DlqStats({"pending": 0, "replayed": 0, "discarded": 0}, {}, {}, 0),
        groups={"worker": GroupMembers("ns.workers", "STABLE", ())},
    )
    state.ok = ok
    return state


def test_the_ages_of_a_good_read_grow_until_the_next_read() -> None:
    assert _age(_state(ok=True), READ_AT + 60) == 65.0


def test_after_a_failed_read_the_ages_are_those_of_the_last_good_read() -> None:
    state = _state(ok=False)
    assert [_age(state, READ_AT + later) for later in (1, 300, 660)] == [5.0, 5.0, 5.0]
