"""A schedule whose record cannot fit in one message is refused where it is made: written, it
would be refused by Kafka every time, and the scheduler could never take the lead."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pipeline import ConfigurationError, Pipeline, Settings
from pipeline._codec import ScheduleCodec
from pipeline._messagesize import RECORD_OVERHEAD
from pipeline._records import Schedule
from pipeline._schedule import make_schedule
from pipeline.testing import InMemoryTransport
from pipeline_cli import cli

NOWHERE = {"PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:9"}


def test_an_application_refuses_a_schedule_too_large_for_a_message() -> None:
    app = Pipeline(Settings(kafka={"message.max.bytes": "10000"}), transport=InMemoryTransport())
    app.schedule("small", cron="* * * * *", job_type="t", payload={"blob": "x" * 9_000})
    with pytest.raises(ConfigurationError, match=r"schedule big takes \d+ bytes, too many"):
        app.schedule("big", cron="* * * * *", job_type="t", payload={"blob": "x" * 10_000})
    assert set(app.schedules) == {"small"}


def test_the_limit_counts_the_whole_record_and_its_overhead() -> None:
    def made(max_bytes: int | None = None) -> Schedule:
        payload = {"blob": "x" * 100}
        return make_schedule(
            "n", cron="* * * * *", job_type="t", payload=payload, max_bytes=max_bytes
        )

    record = len(ScheduleCodec().encode(made())) + len(b"n")
    assert made(record + RECORD_OVERHEAD).payload == made().payload
    with pytest.raises(ConfigurationError, match="too many for one message"):
        made(record)  # librdkafka would refuse it


def test_schedules_add_refuses_a_schedule_too_large_for_a_message() -> None:
    payload = '{"blob": "' + "x" * 1_100_000 + '"}'
    args = ["schedules", "add", "big", "--cron", "* * * * *", "--type", "t", "--payload", payload]
    result = CliRunner().invoke(cli, args, env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert "schedule big takes" in result.output
