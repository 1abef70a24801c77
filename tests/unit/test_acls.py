"""The role plans of ``pipeline acls``: pure, stable, least privilege (no broker)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline import Settings
from pipeline._acls import Operation, PatternKind, ResourceKind, Role, plan_acls
from pipeline_cli import cli


def rules(role: Role, **settings: Any) -> set[str]:
    return {r.describe() for r in plan_acls(role, "User:u", Settings(namespace="ns", **settings))}


def test_plan_json_is_stable_and_sorted() -> None:
    args = ["acls", "plan", "--role", "worker", "--principal", "User:w", "--namespace", "ns"]
    runs = [CliRunner().invoke(cli, [*args, "--json"]) for _ in range(2)]
    assert [r.exit_code for r in runs] == [0, 0], runs[0].output
    assert runs[0].stdout == runs[1].stdout
    plan = json.loads(runs[0].stdout)
    keys = [(p["resource"], p["pattern"], p["name"], p["operation"]) for p in plan]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)
    assert {p["principal"] for p in plan} == {"User:w"}


def test_the_producer_only_writes_jobs() -> None:
    assert rules(Role.PRODUCER) == {"TOPIC ns.jobs.* WRITE", "TOPIC ns.deferred WRITE"}


def test_the_worker_uses_its_groups_and_transactional_ids() -> None:
    worker = rules(Role.WORKER, worker={"group_id": "fleet"})
    # The relays' group is one per namespace; the one they used before is read when taken over.
    assert {"GROUP fleet READ", "GROUP ns.workers.retry READ", "GROUP fleet.retry DESCRIBE"} <= (
        worker
    )
    assert "GROUP fleet.retry READ" not in worker
    default = rules(Role.WORKER)  # nothing to take over
    assert {r for r in default if r.startswith("GROUP") and ".retry" in r} == {
        "GROUP ns.workers.retry READ",
        "GROUP ns.workers.retry DESCRIBE_CONFIGS",
    }
    assert {"TRANSACTIONAL_ID ns.worker.* WRITE", "TRANSACTIONAL_ID ns.relay.* WRITE"} <= worker
    assert not any(r.startswith("TOPIC ns.schedules") for r in worker)
    assert not any("CREATE" in r or "ALTER" in r.split()[-1] for r in worker)


def test_the_scheduler_follows_its_settings() -> None:
    scheduler = rules(Role.SCHEDULER, scheduler={"group_id": "lead", "transactional_id": "tx"})
    assert {"GROUP lead READ", "GROUP ns.scheduler.deferred READ", "TRANSACTIONAL_ID tx WRITE"} <= (
        scheduler
    )


def test_the_operator_replays_undecodable_messages_to_their_source() -> None:
    # ``dlq replay`` sends an undecodable message back byte for byte to the topic it came
    # from: the retry relay's and the scheduler's come from the retry tiers and deferred topics.
    operator = rules(Role.OPERATOR)
    wanted = {"TOPIC ns.retry.* WRITE", "TOPIC ns.deferred WRITE", "TOPIC ns.deferred.* WRITE"}
    assert wanted <= operator
    assert not {"TOPIC ns.* WRITE", "TOPIC ns.dlq WRITE"} & operator


def test_only_the_admin_creates_or_alters_topics() -> None:
    changing = {Operation.CREATE, Operation.ALTER, Operation.ALTER_CONFIGS}
    for role in Role:
        plan = plan_acls(role, "User:u", Settings(namespace="ns"))
        topics = {r.operation for r in plan if r.resource is ResourceKind.TOPIC}
        assert bool(topics & changing) == (role is Role.ADMIN), role
        assert all(r.pattern in PatternKind for r in plan)


def test_a_principal_must_be_a_user() -> None:
    with pytest.raises(ValueError, match="User:<name>"):
        plan_acls(Role.PRODUCER, "alice", Settings())
    result = CliRunner().invoke(cli, ["acls", "plan", "--role", "admin", "--principal", "bob"])
    assert result.exit_code == 2
    assert "User:<name>" in result.output


def test_the_wildcard_principal_is_planned_with_a_warning() -> None:
    """``User:*`` is every client that connects: a plan for it was printed like any other."""
    args = ["acls", "plan", "--role", "worker", "--principal", "User:*", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "warning: User:* is Kafka's wildcard principal" in result.stderr
    assert "warning" not in result.stdout  # the JSON stays whole
    plain = CliRunner().invoke(cli, [*args[:-2], "User:alice", "--json"])
    assert "warning" not in plain.stderr
