"""Each role's ACLs (``pipeline acls apply``) on the secured cluster: enough, and no more.

One namespace and one SCRAM user per role serve the module: the super user applies each
role's ACLs, the admin role's user applies the topics, then each test acts as one role and
checks that it does its job and is refused, with an error naming what is missing, outside it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]

from pipeline import Pipeline, Settings
from pipeline._aclapply import apply_acls
from pipeline._acls import Role, plan_acls
from pipeline._admin import apply_topics
from pipeline._deadletters import read_dead_letters
from pipeline._errors import NotAuthorizedError, TopicAdminError
from pipeline._schedule import make_schedule, publish_schedules
from pipeline._topics import TopicNames
from pipeline_cli import cli
from pipeline_cli._devusers import client_env
from tests.integration.scheduler.conftest import SchedulerFactory, scheduler_env
from tests.integration.worker.harness import Recording, WorkerLauncher
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pipeline_cli.devbroker import DevCluster


@dataclass(frozen=True)
class Roles:
    namespace: str
    superuser: Settings
    users: dict[Role, Settings]

    def env(self, role: Role) -> dict[str, str]:
        settings = self.users[role]
        return {
            **client_env(settings.bootstrap_servers, settings.security),
            "PIPELINE_NAMESPACE": self.namespace,
        }


@pytest.fixture(scope="module")
def roles(secure_cluster: DevCluster) -> Roles:
    namespace = f"roles{uuid.uuid4().hex[:8]}"
    superuser = Settings(
        bootstrap_servers=secure_cluster.bootstrap_servers,
        namespace=namespace,
        security=secure_cluster.security(),
    )
    users: dict[Role, Settings] = {}
    for role in Role:
        name = f"{namespace}-{role.value}"
        security = secure_cluster.add_user(name)
        apply_acls(superuser, plan_acls(role, f"User:{name}", superuser))
        users[role] = superuser.model_copy(update={"security": security})
    apply_topics(users[Role.ADMIN])  # the admin role may create the topics
    return Roles(namespace, superuser, users)


def consumer_error(settings: Settings, topic: str, group: str) -> KafkaError:
    """The error a consumer of ``topic`` in ``group`` with ``settings`` gets."""
    consumer = Consumer(
        {**settings.client_config(), "group.id": group, "auto.offset.reset": "earliest"}
    )
    errors: list[KafkaError] = []

    def failed() -> bool:
        message = consumer.poll(0.2)
        error = message.error() if message is not None else None
        if error is not None:
            errors.append(error)
        return bool(errors)

    try:
        consumer.subscribe([topic])
        assert wait_for(failed, 30), f"reading {topic} was not refused"
    finally:
        consumer.close()
    return errors[0]


@pytest.fixture
def workers(roles: Roles, tmp_path: Path) -> Iterator[tuple[WorkerLauncher, Recording]]:
    record = tmp_path / "record.txt"
    record.touch()
    launcher = WorkerLauncher(
        roles.users[Role.WORKER], record, tmp_path, env=roles.env(Role.WORKER)
    )
    try:
        yield launcher, Recording(record)
    finally:
        launcher.stop_all()


def test_the_producer_enqueues_but_reads_nothing(roles: Roles) -> None:
    producer = roles.users[Role.PRODUCER]
    app = Pipeline(producer)
    try:
        app.enqueue("noop", {"n": 1}, wait=True)
        app.enqueue("noop", {"n": 2}, delay=3600, wait=True)
    finally:
        app.close()
    names = TopicNames(roles.namespace)
    error = consumer_error(producer, names.jobs("default"), f"{roles.namespace}.workers")
    # Refused by its group (it has none) before the topic is even asked for.
    assert error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error
    user = producer.security.sasl_username
    lacks = f"Kafka user {user} lacks READ on TOPIC {names.dlq} "
    with pytest.raises(NotAuthorizedError, match=lacks):
        read_dead_letters(producer, timeout=15)
    nightly = make_schedule("nightly", cron="0 3 * * *", job_type="noop")
    with pytest.raises(NotAuthorizedError, match=f"lacks READ on TOPIC {names.schedules} "):
        publish_schedules(producer, [nightly], timeout=15)


def test_the_worker_runs_jobs_and_may_not_alter_topics(
    roles: Roles, workers: tuple[WorkerLauncher, Recording]
) -> None:
    launcher, recording = workers
    worker = launcher.start()
    app = Pipeline(roles.users[Role.PRODUCER])
    try:
        job_id = app.enqueue("noop", {"n": 7}, wait=True)
    finally:
        app.close()
    assert wait_for(lambda: job_id in {e.job_id for e in recording.refresh()}, 60), worker.log()
    worker_user = roles.users[Role.WORKER]
    refused = "Kafka refused to describe configs of topic .*TOPIC_AUTHORIZATION_FAILED"
    with pytest.raises(TopicAdminError, match=refused):
        apply_topics(worker_user, timeout=15)
    nightly = make_schedule("nightly", cron="0 3 * * *", job_type="noop")
    names = TopicNames(roles.namespace)
    with pytest.raises(NotAuthorizedError, match=f"lacks READ on TOPIC {names.schedules} "):
        publish_schedules(worker_user, [nightly], timeout=15)


def test_no_role_but_the_admin_creates_topics(roles: Roles) -> None:
    for role in Role:
        admin = AdminClient({**roles.users[role].client_config()})
        topic = f"{roles.namespace}.extra-{role.value}"
        future = admin.create_topics([NewTopic(topic, 1, 1)])[topic]
        if role is Role.ADMIN:
            future.result(timeout=30)
            continue
        with pytest.raises(KafkaException) as caught:
            future.result(timeout=30)
        assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, role


def test_acls_apply_twice_creates_nothing_the_second_time(roles: Roles) -> None:
    runner = CliRunner()
    env = {
        **client_env(roles.superuser.bootstrap_servers, roles.superuser.security),
        "PIPELINE_NAMESPACE": roles.namespace,
    }
    args = ["acls", "apply", "--role", "operator", "--principal", "User:someone", "--json"]
    first = runner.invoke(cli, args, env=env)
    assert first.exit_code == 0, first.output
    made = json.loads(first.stdout)
    assert made["present"] == []
    assert made["created"], made
    second = runner.invoke(cli, args, env=env)
    assert second.exit_code == 0, second.output
    again = json.loads(second.stdout)
    assert again["created"] == []
    assert again["present"] == made["created"]


def test_the_scheduler_releases_a_delayed_job(
    roles: Roles, workers: tuple[WorkerLauncher, Recording], tmp_path: Path
) -> None:
    launcher, recording = workers
    launcher.start()
    schedulers = SchedulerFactory(roles.users[Role.SCHEDULER], tmp_path)
    env = {**roles.env(Role.SCHEDULER), **scheduler_env(horizon_s=2, wait_tiers_s=[1, 3])}
    scheduler = schedulers.start(env)
    try:
        app = Pipeline(roles.users[Role.PRODUCER])
        try:
            job_id = app.enqueue("noop", {"n": 8}, delay=1, wait=True)
        finally:
            app.close()
        ran = wait_for(lambda: job_id in {e.job_id for e in recording.refresh()}, 60)
        assert ran, scheduler.output()[-3000:]
    finally:
        scheduler.kill()


def test_the_operator_replays_a_dead_letter_and_reads_status(
    roles: Roles, workers: tuple[WorkerLauncher, Recording]
) -> None:
    launcher, recording = workers
    launcher.start()
    app = Pipeline(roles.users[Role.PRODUCER])
    try:
        job_id = app.enqueue("doomed", {"n": 9, "fatal": True}, wait=True)
    finally:
        app.close()
    operator = roles.users[Role.OPERATOR]

    def dead() -> bool:
        return job_id in {s.letter.job_id for s in read_dead_letters(operator).letters}

    assert wait_for(dead, 60)
    runner = CliRunner()
    env = roles.env(Role.OPERATOR)
    replayed = runner.invoke(cli, ["dlq", "replay", "--type", "doomed", "--yes", "--json"], env=env)
    assert replayed.exit_code == 0, replayed.output
    assert job_id in replayed.stdout
    status = runner.invoke(cli, ["status", "--json"], env=env)
    assert status.exit_code == 0, status.output
    assert wait_for(lambda: recording.count("S", "doomed") >= 2, 60)
