"""A service whose user may not write a topic of its role stops at start, naming the ACL.

A worker writes ``<ns>.dlq`` only when a job is dead-lettered: without the check at start it
would run jobs until the first such one, whose refused move stopped it (exit 1) with that job
unfinished, to be run and refused again by every worker after it. Here the user has its role's
ACLs but WRITE on ``<ns>.dlq`` (the scheduler: on ``<ns>.scheduler-state``), and the process
exits 4, as for refused credentials, with the message that names the topic and the command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import TYPE_CHECKING

import pytest

from pipeline import Settings
from pipeline._aclapply import apply_acls
from pipeline._acls import Operation, Role, plan_acls
from pipeline._admin import apply_topics
from pipeline._topics import TopicNames
from pipeline_cli._devusers import client_env
from tests.integration.worker.harness import REPO_ROOT, WorkerLauncher

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline._settings import SecuritySettings
    from pipeline_cli.devbroker import DevCluster

REFUSED_EXIT = 4
EXIT_WITHIN_S = 60.0
"""A bound on the refused service's exit, its interpreter's start included (it takes seconds)."""


@pytest.fixture(scope="module")
def superuser(secure_cluster: DevCluster) -> Settings:
    settings = Settings(
        bootstrap_servers=secure_cluster.bootstrap_servers,
        namespace=f"writes{uuid.uuid4().hex[:8]}",
        security=secure_cluster.security(),
    )
    apply_topics(settings)
    return settings


def user_without_write(
    cluster: DevCluster, superuser: Settings, role: Role, topic: str
) -> tuple[str, SecuritySettings]:
    """A new user with ``role``'s ACLs but WRITE on ``topic``."""
    name = f"{superuser.namespace}-{role.value}"
    security = cluster.add_user(name)
    rules = plan_acls(role, f"User:{name}", superuser)
    kept = [r for r in rules if not (r.name == topic and r.operation is Operation.WRITE)]
    assert len(kept) == len(rules) - 1
    apply_acls(superuser, kept)
    return name, security


def assert_clear(log: str, name: str, topic: str, role: Role) -> None:
    lacks = f"Kafka user {name} lacks WRITE on TOPIC {topic} (TOPIC_AUTHORIZATION_FAILED)"
    fix = f"`pipeline acls apply --role {role.value} --principal User:{name}`"
    [line] = [line for line in log.splitlines() if lacks in line]
    assert " ERROR " in line, log
    assert "stopping: " in line, log
    assert fix in line, log


def test_a_worker_that_may_not_write_the_dead_letters_exits_at_start(
    secure_cluster: DevCluster, superuser: Settings, tmp_path: Path
) -> None:
    dlq = TopicNames(superuser.namespace).dlq
    name, security = user_without_write(secure_cluster, superuser, Role.WORKER, dlq)
    record = tmp_path / "record.txt"
    record.touch()
    launcher = WorkerLauncher(superuser, record, tmp_path)
    try:
        worker = launcher.start(env=client_env(superuser.bootstrap_servers, security))
        assert worker.wait(timeout=EXIT_WITHIN_S) == REFUSED_EXIT, worker.log_tail()
    finally:
        launcher.stop_all()
    assert_clear(worker.log(), name, dlq, Role.WORKER)
    # It stopped before joining any group: the workers', or the retry tiers' of its relay.
    assert "partitions assigned" not in worker.log()


def test_a_scheduler_that_may_not_write_its_state_exits_at_start(
    secure_cluster: DevCluster, superuser: Settings
) -> None:
    state = TopicNames(superuser.namespace).scheduler_state
    name, security = user_without_write(secure_cluster, superuser, Role.SCHEDULER, state)
    env = {
        **os.environ,
        **client_env(superuser.bootstrap_servers, security),
        "PIPELINE_NAMESPACE": superuser.namespace,
    }
    env.pop("PIPELINE_CONFIG_FILE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline_scheduler"],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=EXIT_WITHIN_S,
        check=False,
    )
    assert done.returncode == REFUSED_EXIT, done.stdout
    assert_clear(done.stdout, name, state, Role.SCHEDULER)
    assert "leadership acquired" not in done.stdout
