"""Bad records on ``<ns>.schedules``, written by a plain producer: skipped, never fatal.

Another writer (another language, an old tool) may put anything on the topic. The scheduler
logs each bad record once, counts it in ``pipeline_scheduler_schedules_invalid``, and keeps
releasing delayed jobs and firing every other schedule; a later record or a tombstone replaces
a bad one, and ``pipeline schedules ls|rm`` handle them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from click.testing import CliRunner
from confluent_kafka import Producer

from pipeline import Pipeline
from pipeline._codec import ScheduleCodec
from pipeline._job import now_ms
from pipeline._records import Schedule
from pipeline._schedule import make_schedule
from pipeline._scheduletable import publish_schedules
from pipeline._settings import Settings
from pipeline._topics import TopicNames
from pipeline_cli._main import cli
from tests import waiting
from tests.integration.worker.harness.metrics import free_port, scrape

from .conftest import Released, SchedulerFactory, collect, job_consumer, scheduler_env

EVERY_2S = "* * * * * */2"
INVALID = "pipeline_scheduler_schedules_invalid"


def record(
    name: str, cron: str, tz: str = "UTC", job_type: str = "cron.bad", created_at: int = -1
) -> bytes:
    """A schedule encoded as any Avro writer would, with no check on its content."""
    schedule = Schedule(
        name=name,
        cron=cron,
        job_type=job_type,
        payload=b"{}",
        timezone=tz,
        created_at=now_ms() if created_at == -1 else created_at,
    )
    return ScheduleCodec().encode(schedule)


def write(settings: Settings, records: dict[str, bytes | None]) -> None:
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    topic = TopicNames(settings.namespace).schedules
    for name, value in records.items():
        producer.produce(topic, value, name.encode())
    assert producer.flush(30) == 0


def cli_run(settings: Settings, *args: str) -> str:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    result = CliRunner().invoke(cli, ["schedules", *args, *common])
    assert result.exit_code == 0, result.output
    return result.output


class Jobs:
    """Every job the scheduler released or fired so far, read as a worker would."""

    def __init__(self, settings: Settings) -> None:
        self.consumer = job_consumer(settings)
        self.seen: list[Released] = []

    def until(self, condition: Callable[[], bool], timeout: float, why: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            self.seen += collect(self.consumer, 10**9, timeout=0.5)
        assert condition(), why

    def ids(self) -> set[str]:
        return {r.job.id for r in self.seen}

    def fires(self, job_type: str, after_ms: int = 0) -> list[int]:
        return [
            r.job.not_before or 0
            for r in self.seen
            if r.job.type == job_type and (r.job.not_before or 0) > after_ms
        ]


def test_bad_schedule_records_are_skipped_and_delayed_jobs_and_other_schedules_still_run(
    schedulers: SchedulerFactory,
) -> None:
    settings = schedulers.settings
    write(
        settings,
        {
            "feb30": record("feb30", "0 3 30 2 *"),  # valid syntax, never fires
            "garbage": b"\xc3\x01 not a schedule at all",
            "no-zone": record("no-zone", "* * * * *", tz="America"),  # a tz directory
            "bad-cron": record("bad-cron", "61 * * * *"),
            "far": record("far", EVERY_2S, created_at=2**62),  # past the year 9999
            # Valid, but written with created_at 0: it must fire without a catch-up from 1970.
            "epoch": record("epoch", EVERY_2S, job_type="cron.epoch", created_at=0),
        },
    )
    publish_schedules(settings, [make_schedule("tick", cron=EVERY_2S, job_type="cron.tick")])
    app = Pipeline(settings)
    early = {app.enqueue("delayed.job", {"i": i}, delay=2) for i in range(5)}
    app.flush()
    port = free_port()
    jobs = Jobs(settings)
    scheduler = schedulers.start(scheduler_env(metrics_port=port))
    try:
        schedulers.wait_leading(scheduler)
        started = now_ms()
        jobs.until(
            lambda: (
                early <= jobs.ids()
                and len(jobs.fires("cron.tick", started)) >= 2
                and len(jobs.fires("cron.epoch", started)) >= 2
            ),
            30,
            f"delayed jobs or tick fires missing:\n{scheduler.output()[-3000:]}",
        )
        assert waiting.wait_for(lambda: (scrape(port) or {}).get(INVALID) == 5.0, 30)

        # While it runs: one more bad record, a fix for another, and more delayed jobs.
        write(
            settings,
            {
                "april31": record("april31", "0 0 31 4 *"),
                "feb30": record("feb30", EVERY_2S, job_type="cron.fixed"),
            },
        )
        late = {app.enqueue("delayed.job", {"i": i}, delay=2) for i in range(5)}
        app.flush()
        live = now_ms()
        jobs.until(
            lambda: (
                late <= jobs.ids()
                and len(jobs.fires("cron.tick", live)) >= 2
                and len(jobs.fires("cron.fixed")) >= 1
            ),
            30,
            f"nothing ran after the live records:\n{scheduler.output()[-3000:]}",
        )
        assert waiting.wait_for(lambda: (scrape(port) or {}).get(INVALID) == 5.0, 30)
        assert jobs.fires("cron.bad") == []

        # ls shows the bad records with their reasons; rm removes one.
        listed = {row["name"]: row for row in json.loads(cli_run(settings, "ls", "--json"))}
        assert {n for n, row in listed.items() if not row["valid"]} == {
            "garbage", "no-zone", "bad-cron", "april31", "far",
        }  # fmt: skip
        assert "never fires" in listed["april31"]["problem"]
        assert "unknown time zone" in listed["no-zone"]["problem"]
        assert listed["garbage"]["problem"].startswith("undecodable record")
        assert listed["tick"]["valid"]
        assert listed["feb30"]["valid"]
        assert "INVALID: invalid cron expression" in cli_run(settings, "ls")
        assert "removed" in cli_run(settings, "rm", "garbage")
        assert waiting.wait_for(lambda: (scrape(port) or {}).get(INVALID) == 4.0, 30)
        assert scheduler.process.poll() is None, scheduler.output()[-3000:]

        # A standby takes over past the same records and serves as well.
        standby = schedulers.start()
        assert scheduler.terminate() == 0
        schedulers.wait_leading(standby)
        after = {app.enqueue("delayed.job", {"i": i}, delay=2) for i in range(5)}
        app.flush()
        takeover = now_ms()
        jobs.until(
            lambda: after <= jobs.ids() and len(jobs.fires("cron.tick", takeover)) >= 2,
            30,
            f"nothing ran after the takeover:\n{standby.output()[-3000:]}",
        )
        assert standby.process.poll() is None, standby.output()[-3000:]
    finally:
        jobs.consumer.close()
    assert standby.terminate() == 0
    log = scheduler.output()
    for name in ("feb30", "garbage", "no-zone", "bad-cron", "april31", "far"):
        lines = [line for line in log.splitlines() if "invalid schedule skipped" in line]
        assert len([line for line in lines if f"schedule={name} " in line]) == 1, (name, lines)
