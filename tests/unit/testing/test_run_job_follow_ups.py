"""The test kit ends a job as the worker does once its handler enqueued jobs: once the
transport acknowledged them, failing with the first it refused."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from pipeline import EnqueueError, Pipeline, Settings
from pipeline.testing import InMemoryTransport, JobStatus, run_job, stub_worker


def apps(refuse: bool) -> tuple[Pipeline, Pipeline, InMemoryTransport]:
    """The application under test, and another its handlers enqueue with (its transport)."""
    fail = KafkaError.TOPIC_AUTHORIZATION_FAILED if refuse else None
    transport = InMemoryTransport(fail_with=fail)
    other = Pipeline(Settings(namespace="billing"), transport=transport)
    return Pipeline(Settings(namespace="acme"), transport=InMemoryTransport()), other, transport


@pytest.mark.parametrize("is_async", [False, True])
def test_a_job_succeeds_once_what_it_enqueued_was_acknowledged(is_async: bool) -> None:
    app, billing, transport = apps(refuse=False)

    if is_async:

        @app.job("order.paid")
        async def paid(order_id: int) -> str:
            billing.enqueue("invoice.send", {"order_id": order_id})
            return "ok"

    else:

        @app.job("order.paid")
        def paid(order_id: int) -> str:
            billing.enqueue("invoice.send", {"order_id": order_id})
            return "ok"

    result = run_job(app, "order.paid", {"order_id": 7})
    assert (result.status, result.value) == (JobStatus.SUCCEEDED, "ok")
    [invoice] = transport.jobs(billing.topics.jobs("default"))
    assert invoice.type == "invoice.send"


def test_a_job_whose_follow_up_was_refused_fails_and_is_retried() -> None:
    app, billing, _ = apps(refuse=True)

    @app.job("order.paid")
    def paid(order_id: int) -> None:
        billing.enqueue("invoice.send", {"order_id": order_id})

    result = run_job(app, "order.paid", {"order_id": 7})
    assert result.status is JobStatus.RETRY
    assert isinstance(result.error, EnqueueError)
    assert "lacks WRITE on TOPIC billing.jobs.default" in str(result.error)
    billing.flush(1)  # the refusal was the job's: not reported again


def test_the_stub_worker_retries_a_job_whose_follow_up_was_refused() -> None:
    app, billing, _ = apps(refuse=True)
    runs: list[int] = []

    @app.job("order.paid", max_attempts=2)
    async def paid(order_id: int) -> None:
        runs.append(order_id)
        billing.enqueue("invoice.send", {"order_id": order_id})

    with stub_worker(app) as worker:
        app.enqueue("order.paid", {"order_id": 7})
        report = worker.drain()
    assert [r.status for r in report.results] == [JobStatus.RETRY, JobStatus.DEAD]
    assert runs == [7, 7]
