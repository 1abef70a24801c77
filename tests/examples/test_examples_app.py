"""The example application's own tests, written with the test kit as a user would write them:
``run_job`` for each handler, and the flow ``make run`` enqueues drained by the stub worker,
through the fixtures of the installed pytest plugin (nothing imported from it here)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pytest
from examples.app import app, enqueue_examples

from pipeline import Priority
from pipeline.testing import DeadLetterReason, FakeClock, JobStatus, StubWorker, run_job

if TYPE_CHECKING:
    from pipeline.testing.plugin import StubFactory


def test_send_email_succeeds_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_job(app, "email.send", {"to": "a@example.com", "subject": "Welcome"})
    assert result.status is JobStatus.SUCCEEDED
    assert result.job is not None
    assert (result.job.priority, result.job.max_attempts) == (Priority.HIGH, 5)
    assert (
        capsys.readouterr().out == "[    high] email.send      to=a@example.com subject='Welcome'\n"
    )


def test_an_email_without_a_subject_is_dead_lettered_as_a_validation_error() -> None:
    result = run_job(app, "email.send", {"to": "a@example.com"})
    assert (result.status, result.reason) == (JobStatus.DEAD, DeadLetterReason.VALIDATION_ERROR)


def test_make_thumbnail_prints_the_image_s_digest(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_job(app, "thumbnail.make", {"image_id": 3})
    assert result.status is JobStatus.SUCCEEDED
    digest = hashlib.sha256(b"3" * 20_000).hexdigest()[:12]
    assert capsys.readouterr().out == f"[ default] thumbnail.make  image=3 digest={digest}\n"


def test_an_image_id_must_be_an_int() -> None:
    result = run_job(app, "thumbnail.make", {"image_id": "3"})
    assert result.reason == DeadLetterReason.VALIDATION_ERROR


def test_build_report_runs_on_the_low_priority(capsys: pytest.CaptureFixture[str]) -> None:
    result = run_job(app, "report.build", {"report_id": 9})
    assert result.status is JobStatus.SUCCEEDED
    assert result.job is not None
    assert result.job.priority is Priority.LOW
    assert capsys.readouterr().out == "[     low] report.build    report=9\n"


def test_the_make_run_flow_runs_by_priority_and_the_delayed_email_last(
    pipeline_stub: StubFactory,
    pipeline_clock: FakeClock,
    capsys: pytest.CaptureFixture[str],
) -> None:
    start = pipeline_clock.now_ms()
    worker: StubWorker = pipeline_stub(app, fail_fast=True)
    ready = enqueue_examples()
    report = worker.drain()

    assert len(report.succeeded) == len(report.results) == ready + 1
    lines = capsys.readouterr().out.splitlines()
    kinds = [line.split()[2] for line in lines]
    expected = ["email.send"] * 8 + ["thumbnail.make"] * 6 + ["report.build"] * 4
    assert kinds == [*expected, "email.send"], "high, default, low, then the delayed email"
    images = [line.split()[3] for line in lines if "thumbnail.make" in line]
    assert images == [f"image={i}" for i in range(6)], "one key's jobs run in enqueue order"
    assert "later@example.com" in lines[-1]
    assert pipeline_clock.now_ms() - start >= 30_000, "the delayed email waited its 30 s"
    assert worker.pending() == []
