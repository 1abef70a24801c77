"""``pipeline status``, ``pipeline jobs show`` and ``pipeline events tail`` against a real Kafka,
with the workers stopped and running."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from click.testing import CliRunner, Result
from confluent_kafka import Producer

from pipeline._deadletters import read_dead_letters
from pipeline_cli._main import cli

from ...waiting import wait_for
from ..scheduler.conftest import scheduler_env
from .harness import enqueue, wait_joined

if TYPE_CHECKING:
    from pipeline import Settings

    from ..scheduler.conftest import SchedulerFactory
    from .fixtures import WorkerKit

LAG_KEYS = {
    "name",
    "topic",
    "group",
    "backlog",
    "oldest_age_s",
    "rate_in",
    "rate_out",
    "partitions",
}
TOP_KEYS = {
    "namespace",
    "at",
    "at_ms",
    "priorities",
    "retry_tiers",
    "deferred",
    "workers",
    "scheduler",
    "dead_letters_pending",
    "schedules",
}


def run(settings: Settings, *args: str, code: int = 0, timeout: bool = True) -> Result:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    result = CliRunner().invoke(cli, [*args, *common, *(["--timeout", "20"] if timeout else [])])
    assert result.exit_code == code, result.output
    return result


def status_json(settings: Settings) -> dict[str, Any]:
    document = json.loads(run(settings, "status", "--json").stdout)
    assert isinstance(document, dict)
    return document


def by_name(lags: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {lag["name"]: lag for lag in lags}


def test_status_with_no_worker_shows_the_backlog_and_the_oldest_job(kit: WorkerKit) -> None:
    enqueue(kit.producer, "noop", 5, priority="high")
    enqueue(kit.producer, "noop", 2, priority="low")
    # A message on a retry tier, which no relay moves while no worker runs.
    producer = Producer(kit.settings.client_config())
    producer.produce(kit.topics.retry(1), b"waiting", partition=0)
    assert producer.flush(30) == 0

    document = status_json(kit.settings)

    assert set(document) == TOP_KEYS
    priorities = by_name(document["priorities"])
    assert list(priorities) == ["critical", "high", "default", "low"]
    for lag in document["priorities"] + document["retry_tiers"] + document["deferred"]:
        assert set(lag) == LAG_KEYS
        assert lag["rate_in"] is None  # a single reading has no rate
    assert {n: lag["backlog"] for n, lag in priorities.items()} == {
        "critical": 0,
        "high": 5,
        "default": 0,
        "low": 2,
    }
    assert priorities["high"]["group"] == f"{kit.settings.namespace}.workers"
    assert priorities["high"]["oldest_age_s"] is not None
    assert 0 <= priorities["high"]["oldest_age_s"] < 120
    assert priorities["default"]["oldest_age_s"] is None
    tiers = by_name(document["retry_tiers"])
    assert list(tiers) == ["0", "1", "2", "3"]
    assert {n: tier["backlog"] for n, tier in tiers.items()} == {"0": 0, "1": 1, "2": 0, "3": 0}
    assert tiers["1"]["group"] == f"{kit.settings.namespace}.workers.retry"
    assert tiers["1"]["oldest_age_s"] is not None
    assert all(t["backlog"] == 0 for t in document["deferred"])
    assert document["workers"]["members"] == []
    assert document["scheduler"]["leader"] is None
    assert document["dead_letters_pending"] == 0
    assert document["schedules"] == []

    table = run(kit.settings, "status").stdout
    assert "workers: group" in table
    assert "0 members" in table
    assert "scheduler: leader none" in table
    high = next(line for line in table.splitlines() if line.startswith("high "))
    assert high.split()[:3] == ["high", kit.topics.jobs("high"), "5"]

    elsewhere = kit.settings.model_copy(update={"namespace": f"{kit.settings.namespace}-none"})
    missing = run(elsewhere, "status", code=1)
    assert "pipeline topics apply" in missing.output


def test_status_lists_the_workers_and_the_drained_backlog(kit: WorkerKit, monkeypatch: Any) -> None:
    monkeypatch.setenv("PIPELINE_EVENTS", "all")
    done = enqueue(kit.producer, "noop", 6, priority="default")
    dead = enqueue(kit.producer, "doomed", 1, first=100, fields={"fatal": True})[0]
    worker = kit.workers.start("--concurrency", "4")
    wait_joined(kit.settings, f"{kit.settings.namespace}.workers", [worker])

    def drained() -> bool:
        document = status_json(kit.settings)
        return all(lag["backlog"] == 0 for lag in document["priorities"])

    assert wait_for(drained, 60, interval=0.2), worker.log_tail()
    assert wait_for(lambda: bool(read_dead_letters(kit.settings).letters), 60), worker.log_tail()

    document = status_json(kit.settings)
    members = document["workers"]["members"]
    assert [m["client_id"] for m in members] == ["worker-1"]
    assert members[0]["host"]
    assert len(members[0]["partitions"]) == 4 * kit.settings.topics.partitions
    assert all(lag["oldest_age_s"] is None for lag in document["priorities"])
    assert document["dead_letters_pending"] == 1
    assert "worker-1" in run(kit.settings, "status").stdout

    # Two refreshes: the second one has rates.
    lines = run(kit.settings, "status", "--json", "--watch", "0.5", "--count", "2").stdout
    refreshes = [json.loads(line) for line in lines.splitlines()]
    assert len(refreshes) == 2
    assert refreshes[0]["priorities"][0]["rate_in"] is None
    assert all(lag["rate_out"] is not None for lag in refreshes[1]["priorities"])

    # jobs show: a succeeded job (events=all) and a dead-lettered one.
    succeeded = done[0]

    def has_succeeded() -> bool:
        shown = json.loads(run(kit.settings, "jobs", "show", succeeded, "--json").stdout)
        return bool(shown["state"] == "succeeded")

    assert wait_for(has_succeeded, 30, interval=0.2), worker.log_tail()
    shown = json.loads(run(kit.settings, "jobs", "show", succeeded, "--json").stdout)
    assert [e["kind"] for e in shown["events"]] == ["started", "succeeded"]
    assert shown["events"][1]["job_type"] == "noop"
    assert shown["dead_letters"] == []
    page = run(kit.settings, "jobs", "show", succeeded).stdout
    assert page.startswith(f"job {succeeded}: succeeded")

    shown = json.loads(run(kit.settings, "jobs", "show", dead, "--json").stdout)
    assert shown["state"] == "dead (pending)"
    assert [e["kind"] for e in shown["events"]] == ["started", "dead"]
    assert [letter["reason"] for letter in shown["dead_letters"]] == ["fatal_error"]
    assert "dead letter" in run(kit.settings, "jobs", "show", dead).stdout

    missing = run(kit.settings, "jobs", "show", "no-such-job", code=1)
    assert "nothing known about job no-such-job" in missing.output

    # events tail, filtered by job and by kind; bounded so that it stops by itself.
    tailed = run(
        kit.settings, "events", "tail", "--from-beginning", "--json", "--job", dead, "--max", "2"
    ).stdout
    # In the order they reached the topic: "started" (best effort) may come after "dead".
    assert sorted(json.loads(line)["kind"] for line in tailed.splitlines()) == ["dead", "started"]
    tailed = run(
        kit.settings,
        "events",
        "tail",
        "--from-beginning",
        "--json",
        "--type",
        "noop",
        "--kind",
        "succeeded",
        "--until-idle",
        "1",
    ).stdout
    seen = [json.loads(line) for line in tailed.splitlines()]
    assert sorted(e["job_id"] for e in seen) == sorted(done)
    assert {e["kind"] for e in seen} == {"succeeded"}


def test_status_shows_the_scheduler_leader_its_lateness_and_the_deferred_jobs(
    kit: WorkerKit, schedulers: SchedulerFactory
) -> None:
    kit.producer.enqueue("noop", {"n": 1}, delay=300)  # within the horizon below: held
    kit.producer.flush(30)
    schedule = ["schedules", "add", "often", "--cron", "* * * * * */2", "--type", "noop"]
    run(kit.settings, *schedule, timeout=False)

    def late() -> bool:
        return float(status_json(kit.settings)["scheduler"]["cron_lateness_s"]) > 1.0

    # No scheduler: the schedule's next fire passes and nobody fires it.
    assert wait_for(late, 30, interval=0.2)
    document = status_json(kit.settings)
    assert document["scheduler"]["leader"] is None
    deferred = by_name(document["deferred"])["deferred"]
    assert deferred["backlog"] == 1
    assert deferred["group"] == f"{kit.settings.namespace}.scheduler.deferred"
    assert document["schedules"][0]["name"] == "often"
    assert document["schedules"][0]["overdue_s"] > 1.0

    env = scheduler_env(horizon_s=600)
    leader = schedulers.start({**env, "PIPELINE_CLIENT_ID": "sched-a"})
    schedulers.wait_leading(leader)
    schedulers.start({**env, "PIPELINE_CLIENT_ID": "sched-b"})

    def led() -> bool:
        scheduler = status_json(kit.settings)["scheduler"]
        return (
            scheduler["leader"] is not None
            and len(scheduler["members"]) == 2
            and scheduler["cron_lateness_s"] < 1.0
        )

    assert wait_for(led, 60, interval=0.2), leader.output()
    document = status_json(kit.settings)
    assert document["scheduler"]["leader"]["client_id"] == "sched-a"
    assert document["scheduler"]["group"] == f"{kit.settings.namespace}.scheduler"
    assert document["schedules"][0]["last_fire"] is not None
    # The leader holds the delayed job: its commit stays below it.
    assert by_name(document["deferred"])["deferred"]["backlog"] == 1
    table = run(kit.settings, "status").stdout
    assert "scheduler: leader sched-a on " in table
    assert "1 standby" in table
