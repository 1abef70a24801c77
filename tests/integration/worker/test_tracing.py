"""A trace crosses the process boundary through Kafka: enqueued in one process inside a span,
the job's attempt in ``pipeline-worker`` is a child of that span, and a job the handler
enqueues is a child of the attempt (``pipeline.otel``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from pipeline import Pipeline, Priority
from pipeline.otel import TracingInterceptor
from tests.waiting import wait_for

from .apps.traced import SPANS_ENV
from .harness import WorkerLauncher

if TYPE_CHECKING:
    from pathlib import Path

    from .fixtures import WorkerKit

pytestmark = pytest.mark.kafka

TRACED_APP = "tests.integration.worker.apps.traced:app"


def _spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_the_worker_continues_the_producers_trace_and_so_do_jobs_its_handler_enqueues(
    kit: WorkerKit, tmp_path: Path
) -> None:
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    producer = Pipeline(kit.settings, middleware=[TracingInterceptor(tracer_provider=provider)])
    with tracer.start_as_current_span("request") as request:
        job_id = producer.enqueue("traced.parent", {"n": 1})
    producer.close(30)
    spans_path = tmp_path / "spans.jsonl"
    launcher = WorkerLauncher(
        kit.settings,
        kit.recording.path,
        tmp_path,
        app=TRACED_APP,
        env={SPANS_ENV: str(spans_path)},
    )
    try:
        worker = launcher.start()
        ran = wait_for(lambda: len(_spans(spans_path)) >= 2, timeout=120)
        assert ran, worker.log_tail()
    finally:
        launcher.stop_all()

    by_type = {s["attributes"]["pipeline.job.type"]: s for s in _spans(spans_path)}
    parent, child = by_type["traced.parent"], by_type["traced.child"]
    context = request.get_span_context()
    assert parent["trace_id"] == child["trace_id"] == f"{context.trace_id:032x}"
    assert parent["parent_id"] == f"{context.span_id:016x}"
    assert child["parent_id"] == parent["span_id"]
    assert parent["name"] == "pipeline.job traced.parent"
    assert parent["status"] == "UNSET"
    assert parent["attributes"]["pipeline.job.id"] == job_id
    assert parent["attributes"]["pipeline.job.outcome"] == "succeeded"
    assert parent["attributes"]["messaging.destination.name"] == kit.topics.jobs(Priority.DEFAULT)
    assert parent["attributes"]["messaging.kafka.message.offset"] == 0
