"""A schedule whose record cannot fit in one message is refused where it is made: written, it
would be refused by Kafka every time, and the scheduler could never take the lead."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipeline import ConfigurationError, Pipeline, Settings
from pipeline._schedule import make_schedule
from pipeline.testing import InMemoryTransport
from pipeline_cli import cli

NOWHERE = {"PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"}


def test_an_application_refuses_a_schedule_too_large_for_a_message() -> None:
    app = Pipeline(Settings(kafka={"message.max.bytes": "10000"}), transport=InMemoryTransport())
    app.schedule("small", cron="* * * * *", job_type="t", payload={"blob": "x" * 9_000})
    with pytest.raises(ConfigurationError, match=r"schedule big takes \d+ bytes, more than"):
        app.schedule("big", cron="* * * * *", job_type="t", payload={"blob": "x" * 10_000})
    assert set(app.schedules) == {"small"}


def test_the_limit_counts_the_whole_record() -> None:
    made = make_schedule("n", cron="* * * * *", job_type="t", payload={"blob": "x" * 100})
    schedule_bytes = len(made.payload)
    fits = make_schedule(
        "n", cron="* * * * *", job_type="t", payload={"blob": "x" * 100}, max_bytes=10_000
    )
    assert fits.payload == made.payload
    with pytest.raises(ConfigurationError):
        make_schedule(
            "n", cron="* * * * *", job_type="t", payload={"blob": "x" * 100},
            max_bytes=schedule_bytes,  # the payload alone: the record is more
        )  # fmt: skip


def test_schedules_add_refuses_a_schedule_too_large_for_a_message() -> None:
    payload = '{"blob": "' + "x" * 1_100_000 + '"}'
    args = ["schedules", "add", "big", "--cron", "* * * * *", "--type", "t", "--payload", payload]
    result = CliRunner().invoke(cli, args, env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert "schedule big takes" in result.output
