"""What the exit hook reports, and how a ``with`` block flushes, against the in-memory transport."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from pipeline import EnqueueError, Pipeline, Settings, _exitflush
from pipeline._delivery import PipelineFailure
from pipeline.testing import InMemoryTransport

REFUSED = KafkaError.TOPIC_AUTHORIZATION_FAILED


def _app(fail_with: int | None = None) -> Pipeline:
    return Pipeline(Settings(namespace="acme"), transport=InMemoryTransport(fail_with=fail_with))


def test_refused_jobs_nobody_flushed_are_reported_with_their_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app(fail_with=REFUSED)
    ids = [app.enqueue("t", {"n": n}) for n in range(25)]
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._flush_at_exit()
    [record] = caplog.records
    message = record.getMessage()
    assert record.levelno == logging.ERROR
    assert message.startswith("25 enqueued job(s) never reached Kafka at localhost:9092")
    assert all(job_id in message for job_id in ids[:20])
    assert not any(job_id in message for job_id in ids[20:])
    assert "and 5 more" in message


def test_nothing_is_reported_when_every_job_was_acknowledged_or_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app()
    app.enqueue("t", {"n": 1})
    failing = _app(fail_with=REFUSED)
    handle = failing.submit("t", {"n": 2})
    with pytest.raises(EnqueueError):
        handle.wait()
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._flush_at_exit()
        failing._flush_at_exit()
    assert caplog.records == [], "a failure raised by wait() is not reported again"


def test_a_submitted_job_nobody_waited_for_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    app = _app(fail_with=REFUSED)
    job_id = app.submit("t", {"n": 1}).job_id
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._flush_at_exit()
    [record] = caplog.records
    assert job_id in record.getMessage()


def test_a_with_block_raises_what_its_flush_found() -> None:
    with pytest.raises(EnqueueError), _app(fail_with=REFUSED) as app:
        app.enqueue("t", {"n": 1})


def test_a_with_block_lets_the_body_error_through_and_logs_the_lost_jobs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[str] = []

    def body() -> None:
        with _app(fail_with=REFUSED) as app:
            sent.append(app.enqueue("t", {"n": 1}))
            raise ValueError("body")

    with (
        caplog.at_level(logging.ERROR, logger="pipeline.producer"),
        pytest.raises(ValueError, match="body"),
    ):
        body()
    [job_id] = sent
    [record] = caplog.records
    assert job_id in record.getMessage()
    assert "while leaving the with block on ValueError" in record.getMessage()


def test_the_count_is_the_purged_jobs_not_the_queue_length_that_also_counts_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """librdkafka's queue length counts pending events (a broker-down error) with messages:
    the jobs lost are the ones the purge named, however many more the queue held."""
    app = _app()
    failures = [PipelineFailure(f"job-{n}", "acme.jobs.default", -152, "purged") for n in range(2)]
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        _exitflush.report_lost(app, failures, unacknowledged=3, timeout=0.5, purged=True)
        # Without a purge, what is still queued is named by nothing but the queue length.
        _exitflush.report_lost(app, failures, unacknowledged=3, timeout=0.5)
    purged, unpurged = caplog.records
    assert purged.getMessage().startswith("2 enqueued job(s) never reached Kafka")
    assert "still unacknowledged 0.5s after exit began" in purged.getMessage()
    assert unpurged.getMessage().startswith("3 enqueued job(s) never reached Kafka")


@pytest.mark.parametrize(
    ("fail_with", "why"),
    [
        (KafkaError._MSG_TIMED_OUT, "(not acknowledged within the delivery timeout of 30s: "),
        (REFUSED, "(refused: Broker: Topic authorization failed)"),
    ],
)
def test_jobs_that_timed_out_are_told_as_timed_out_not_as_refused(
    caplog: pytest.LogCaptureFixture, fail_with: int, why: str
) -> None:
    app = _app(fail_with=fail_with)
    app.enqueue("t", {"n": 1})
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._flush_at_exit()
    [record] = caplog.records
    assert why in record.getMessage()


def test_jobs_that_timed_out_and_refused_ones_are_told_apart(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = _app()
    failures = [
        PipelineFailure(
            "job-1", "acme.jobs.default", REFUSED, "Broker: Topic authorization failed"
        ),
        PipelineFailure("job-2", "acme.jobs.default", KafkaError._MSG_TIMED_OUT, "timed out"),
    ]
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        _exitflush.report_lost(app, failures, unacknowledged=0, timeout=30)
    [record] = caplog.records
    assert (
        "(refused: Broker: Topic authorization failed; "
        "not acknowledged within the delivery timeout of 30s: timed out)"
    ) in record.getMessage()


class _KafkaDownWithoutPurge(InMemoryTransport):
    """Acknowledges nothing, cannot purge, and counts two pending events in what ``flush``
    says is left, as librdkafka's queue length does."""

    def flush(self, timeout: float) -> int:
        return len(self._pending) + 2


def test_the_exit_report_counts_the_jobs_left_not_the_events_in_the_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Pipeline(Settings(namespace="acme"), transport=_KafkaDownWithoutPurge())
    for n in range(11):
        app.enqueue("t", {"n": n})
    with caplog.at_level(logging.ERROR, logger="pipeline.producer"):
        app._flush_at_exit()
    [record] = caplog.records
    assert record.getMessage().startswith("11 enqueued job(s) never reached Kafka")
