"""A stopped stub worker: what was enqueued to it is acknowledged, it runs nothing more, and its
application flushes on its own transport as if the stub had never been there."""

from __future__ import annotations

import pytest

from pipeline import ConfigurationError, Pipeline, Settings
from pipeline.testing import InMemoryTransport, StubWorker, stub_worker

QUICK_S = 1.0
"""A flush that waited for a job the stub never acknowledged took its whole timeout, then
raised ``KafkaUnavailableError``: a short one keeps such a failure short."""


def make_app() -> tuple[Pipeline, InMemoryTransport]:
    own = InMemoryTransport()
    return Pipeline(Settings(namespace="acme"), transport=own), own


def test_jobs_never_drained_do_not_hold_the_app_s_later_flushes() -> None:
    app, own = make_app()

    @app.job("echo")
    def echo(n: int) -> int:
        return n

    with stub_worker(app) as first:  # one test enqueues, and drains nothing
        app.enqueue("echo", {"n": 1})
    with stub_worker(app) as second:  # the next one's code flushes
        app.enqueue("echo", {"n": 2})
        app.flush(QUICK_S)
        assert [r.value for r in second.drain().succeeded] == [2]
    app.flush(QUICK_S)  # and on the application's own transport
    assert own.messages == []
    [left] = first.pending()
    assert left.payload == b'{"n":1}', "not run: still in the stub that was stopped"


def test_the_follow_ups_of_a_run_fail_fast_raised_do_not_hold_later_flushes() -> None:
    app, _ = make_app()

    @app.job("order.place")
    def place(order_id: int) -> None:
        app.enqueue("order.audit", {"order_id": order_id})
        raise RuntimeError("gateway down")

    with stub_worker(app, fail_fast=True) as worker:
        app.enqueue("order.place", {"order_id": 1})
        with pytest.raises(RuntimeError, match="gateway down"):
            worker.drain()
    with stub_worker(app):
        app.enqueue("order.audit", {"order_id": 2})
        app.flush(QUICK_S)


def test_a_stub_not_started_runs_nothing() -> None:
    """``drain()`` after the block ran the jobs, and what they enqueued went to the
    application's own transport (to Kafka, for a real application)."""
    app, own = make_app()

    @app.job("place")
    def place(n: int) -> None:
        app.enqueue("ship", {"n": n})

    with stub_worker(app) as worker:
        app.enqueue("place", {"n": 7})
    with pytest.raises(ConfigurationError, match="not started"):
        worker.drain()
    [job] = worker.pending()
    assert job.type == "place"
    assert own.messages == []
    with pytest.raises(ConfigurationError, match="not started"):
        StubWorker(app).drain()
