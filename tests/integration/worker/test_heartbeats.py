"""Worker heartbeats against a real Kafka: a worker whose jobs are held shows them in flight on
``<ns>.workers`` and in ``pipeline status``; a clean stop removes it, and only it where replicas
share a client id; a namespace whose topics predate heartbeats keeps its workers running, with
one warning."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient

from pipeline._workerbeats import WorkerBeat, read_process_beats, read_worker_beats
from pipeline_cli._main import cli

from ...waiting import wait_for
from .harness import enqueue, wait_joined
from .harness.gates import Gates

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pipeline import Settings

    from .fixtures import WorkerKit

FAST = {"PIPELINE_WORKER__HEARTBEAT_INTERVAL_S": "0.5"}
MISSING = "does not exist, or Kafka's ACLs hide it from this worker"


@pytest.fixture
def gates() -> Iterator[Gates]:
    opened = Gates()
    yield opened
    opened.close()


def status_members(settings: Settings) -> list[dict[str, object]]:
    common = ["--bootstrap-servers", settings.bootstrap_servers, "--namespace", settings.namespace]
    result = CliRunner().invoke(cli, ["status", "--json", "--timeout", "15", *common])
    assert result.exit_code == 0, result.output
    members = json.loads(result.stdout)["workers"]["members"]
    assert isinstance(members, list)
    return members


def test_held_jobs_show_in_flight_and_a_clean_stop_removes_the_worker(
    kit: WorkerKit, gates: Gates
) -> None:
    worker = kit.workers.start("--concurrency", "4", env=FAST)
    wait_joined(kit.settings, f"{kit.settings.namespace}.workers", [worker])
    enqueue(kit.producer, "gate", 3, fields={"port": gates.port, "timeout_s": 60})
    gates.wait_held(3, 30)

    seen: dict[str, WorkerBeat] = {}

    def busy() -> bool:
        seen.update(read_worker_beats(kit.settings, timeout=10))
        beat = seen.get(worker.client_id)
        return beat is not None and beat.in_flight == 3 and beat.utilization > 0.5

    assert wait_for(busy, 15, interval=0.2), (seen, worker.log_tail())
    beat = seen[worker.client_id]
    assert beat.concurrency == 4
    assert beat.pid == worker.pid
    assert beat.group == f"{kit.settings.namespace}.workers"
    assert len(beat.partitions) == 4 * kit.settings.topics.partitions  # co-partitioned: all
    assert not beat.stale

    members = status_members(kit.settings)
    assert [m["client_id"] for m in members] == [worker.client_id]
    assert members[0]["in_flight"] == 3
    assert members[0]["concurrency"] == 4
    assert members[0]["pid"] == worker.pid

    gates.release()
    assert wait_for(lambda: kit.recording.count("E", "gate") == 3, 15), worker.log_tail()
    worker.terminate()
    assert worker.wait(30) == 0, worker.log_tail()
    beats = read_worker_beats(kit.settings, timeout=10)
    assert worker.client_id not in beats, "a clean stop leaves a tombstone"
    assert MISSING not in worker.log()


def test_replicas_sharing_a_client_id_keep_their_own_heartbeats(kit: WorkerKit) -> None:
    shared = {**FAST, "PIPELINE_CLIENT_ID": "replica"}  # one Deployment's env for every pod
    first = kit.workers.start(env=shared)
    second = kit.workers.start(env=shared)

    def live_pids() -> set[int]:
        beats = read_process_beats(kit.settings, timeout=10).values()
        return {beat.pid for beat in beats if beat.client_id == "replica" and not beat.stale}

    both = {first.pid, second.pid}
    assert wait_for(lambda: live_pids() == both, 30, interval=0.2), (
        first.log_tail(),
        second.log_tail(),
    )
    # Each member of the group is joined to its own heartbeat, by its member id.
    shown: list[dict[str, object]] = []

    def each_its_own() -> bool:
        shown[:] = status_members(kit.settings)
        return len(shown) == 2 and {m["pid"] for m in shown} == both

    assert wait_for(each_its_own, 30, interval=0.2), shown
    assert {m["client_id"] for m in shown} == {"replica"}
    first.terminate()
    assert first.wait(30) == 0, first.log_tail()
    assert live_pids() == {second.pid}, "the tombstone removed the other replica's heartbeat"
    assert read_worker_beats(kit.settings, timeout=10)["replica"].pid == second.pid
    second.terminate()
    assert second.wait(30) == 0, second.log_tail()


def test_a_missing_workers_topic_warns_once_and_the_worker_runs_on(kit: WorkerKit) -> None:
    admin = AdminClient({"bootstrap.servers": kit.settings.bootstrap_servers})
    for future in admin.delete_topics([kit.topics.workers], operation_timeout=10).values():
        future.result(15)
    assert wait_for(lambda: kit.topics.workers not in admin.list_topics(timeout=10).topics, 10)

    worker = kit.workers.start(env=FAST)
    assert wait_for(lambda: MISSING in worker.log() or not worker.alive(), 15), worker.log_tail()
    enqueue(kit.producer, "noop", 5)
    assert wait_for(lambda: kit.recording.count("E", "noop") == 5, 20), worker.log_tail()

    assert worker.alive(), worker.log_tail()
    log = worker.log()
    assert log.count(MISSING) == 1, worker.log_tail()
    assert "pipeline topics apply" in log
    assert read_worker_beats(kit.settings, timeout=10) == {}  # nor was the topic created
    worker.terminate()
    assert worker.wait(30) == 0, worker.log_tail()
