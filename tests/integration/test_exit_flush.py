"""A script that enqueues and exits without ``flush()``: its jobs reach Kafka, or it says so.

Each script runs in its own interpreter, as a user's script would, against the real broker
(or an address where no broker listens).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pipeline import Settings
from pipeline._admin import apply_topics
from pipeline._codec import JobCodec

from .test_enqueue import read_all

pytestmark = pytest.mark.kafka

NOWHERE = "localhost:1"


def _run(script: str, servers: str, namespace: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "PIPELINE_BOOTSTRAP_SERVERS": servers,
        "PIPELINE_NAMESPACE": namespace,
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


ENQUEUE_AND_EXIT = """
    from pipeline import Pipeline

    app = Pipeline()
    print(app.enqueue("report.build", {"n": 1}))
    print(app.submit("report.build", {"n": 2}).job_id)
"""


def test_jobs_enqueued_without_flush_reach_kafka_at_exit(settings: Settings) -> None:
    apply_topics(settings)
    assert_every_job_reached_kafka(settings, ENQUEUE_AND_EXIT, 2)


def assert_every_job_reached_kafka(settings: Settings, script: str, count: int) -> None:
    """``script`` exits 0 having printed the ids of the ``count`` jobs it enqueued, each of
    which is on ``<ns>.jobs.default``, and reports none as lost."""
    result = _run(script, settings.bootstrap_servers, settings.namespace)
    assert result.returncode == 0, result.stderr
    ids = result.stdout.split()
    assert len(ids) == count
    messages = read_all(settings.bootstrap_servers, f"{settings.namespace}.jobs.default", count)
    assert sorted(JobCodec().decode(m.value() or b"").id for m in messages) == sorted(ids)
    assert "never reached Kafka" not in result.stderr


@pytest.mark.parametrize(
    ("delivery_timeout", "exit_timeout"),
    [("1", "20"), ("30", "0.5")],
    ids=["delivery-timed-out-before-exit-gave-up", "still-queued-when-exit-gave-up"],
)
def test_jobs_that_never_reached_kafka_are_reported_at_exit(
    namespace: str, delivery_timeout: str, exit_timeout: str
) -> None:
    result = _run(
        ENQUEUE_AND_EXIT,
        NOWHERE,
        namespace,
        PIPELINE_PRODUCER__DELIVERY_TIMEOUT_S=delivery_timeout,
        PIPELINE_PRODUCER__EXIT_FLUSH_TIMEOUT_S=exit_timeout,
    )
    ids = result.stdout.split()
    assert len(ids) == 2, result.stderr
    [report] = [line for line in result.stderr.splitlines() if "never reached Kafka" in line]
    assert report.startswith(f"2 enqueued job(s) never reached Kafka at {NOWHERE} and are lost")
    for job_id in ids:
        assert job_id in report
    # Python ignores what an atexit function raises: the status cannot say it (documented).
    assert result.returncode == 0


def test_a_with_block_raises_when_its_jobs_are_not_acknowledged(namespace: str) -> None:
    script = """
        from pipeline import Pipeline

        with Pipeline() as app:
            app.enqueue("report.build", {"n": 1})
    """
    result = _run(script, NOWHERE, namespace, PIPELINE_PRODUCER__DELIVERY_TIMEOUT_S="1")
    assert result.returncode == 1
    assert "KafkaUnavailableError" in result.stderr
    assert "never reached Kafka" not in result.stderr, "raised once, not reported twice"


def test_a_with_block_keeps_the_body_error_and_still_reports_the_lost_jobs(
    namespace: str,
) -> None:
    script = """
        from pipeline import Pipeline

        with Pipeline() as app:
            print(app.enqueue("report.build", {"n": 1}))
            raise ValueError("the body failed")
    """
    result = _run(script, NOWHERE, namespace, PIPELINE_PRODUCER__DELIVERY_TIMEOUT_S="1")
    assert result.returncode == 1
    assert result.stderr.rstrip().endswith("ValueError: the body failed")
    [job_id] = result.stdout.split()
    # The producer's polling thread may log the loss as it comes too (a line tells no call:
    # the flush still raises it), so the with block's own line is the one looked for.
    [report] = [line for line in result.stderr.splitlines() if "leaving the with block" in line]
    assert job_id in report
    assert "not acknowledged" in report
    assert "(while leaving the with block on ValueError)" in report
