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
from pipeline._errors import PipelineError
from pipeline._schedule import make_schedule, publish_schedules
from pipeline._topics import TopicNames
from pipeline_cli import cli
from pipeline_cli._devusers import client_env
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


def kafka_error(exc: BaseException) -> KafkaError:
    """The KafkaError a PipelineError was caused by (or a KafkaException carries)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KafkaException) and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__
    raise AssertionError(f"no KafkaError behind {exc!r}")


def consumer_error(settings: Settings, topic: str, group: str) -> KafkaError:
    """The error a consumer of ``topic`` in ``group`` with ``settings`` gets."""
    consumer = Consumer(
        {**settings.client_config(), "group.id": group, "auto.offset.reset": "earliest"}
    )
    errors: list[KafkaError] = []

    def failed() -> bool:
        message = consumer.poll(0.2)
        if message is not None and message.error() is not None:
            errors.append(message.error())
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
    with pytest.raises(PipelineError) as caught:
        read_dead_letters(producer, timeout=15)
    print("producer dlq:", caught.value)
    with pytest.raises(PipelineError) as denied:
        publish_schedules(
            producer, [make_schedule("nightly", cron="0 3 * * *", job_type="noop")], timeout=15
        )
    print("producer schedules:", denied.value)


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
    with pytest.raises(PipelineError) as caught:
        apply_topics(roles.users[Role.WORKER], timeout=15)
    print("worker topics apply:", caught.value)


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
    assert made["present"] == [] and made["created"], made
    second = runner.invoke(cli, args, env=env)
    assert second.exit_code == 0, second.output
    again = json.loads(second.stdout)
    assert again["created"] == [] and again["present"] == made["created"]
