"""Each role's ACLs (``pipeline acls apply``) on the secured cluster: enough, and no more.

One namespace and one SCRAM user per role serve the module: the super user applies each
role's ACLs, the admin role's user applies the topics, then each test acts as one role and
checks that it does its job and is refused, with an error naming what is missing, outside it.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]

from pipeline import Pipeline, Settings
from pipeline._aclapply import apply_acls
from pipeline._acls import Role, plan_acls
from pipeline._admin import apply_topics
from pipeline._codec import DeadLetterCodec, JobCodec
from pipeline._deadletters import read_dead_letters
from pipeline._errors import EnqueueError, NotAuthorizedError, TopicAdminError
from pipeline._records import DeadLetter
from pipeline._schedule import make_schedule
from pipeline._scheduletable import publish_schedules
from pipeline._topics import TopicNames
from pipeline._topicspec import deferred_tier_topic
from pipeline_cli import cli
from pipeline_cli._devusers import client_env
from tests.integration.scheduler.conftest import SchedulerFactory, scheduler_env
from tests.integration.worker.harness import Recording, WorkerLauncher
from tests.waiting import wait_for

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from pipeline_cli.devbroker import DevCluster


CRON_APP = "tests.integration.scheduler.cronapp:app"
RETRY_DELAYS_S = [0.5, 2.0]
"""Retry tiers short enough for the recording app's retries (0.5 s, then 1 s) to use them."""


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
            "PIPELINE_TOPICS__RETRY_DELAYS_S": json.dumps(RETRY_DELAYS_S),
        }


@pytest.fixture(scope="module")
def roles(secure_cluster: DevCluster) -> Roles:
    namespace = f"roles{uuid.uuid4().hex[:8]}"
    superuser = Settings(
        bootstrap_servers=secure_cluster.bootstrap_servers,
        namespace=namespace,
        security=secure_cluster.security(),
        topics={"retry_delays_s": RETRY_DELAYS_S},
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


def started(recording: Recording, job_id: str) -> bool:
    recording.refresh()
    return job_id in recording.start_counts


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


def test_a_refused_write_names_the_missing_acl(roles: Roles, secure_cluster: DevCluster) -> None:
    name = f"{roles.namespace}-nobody"
    nobody = roles.superuser.model_copy(update={"security": secure_cluster.add_user(name)})
    app = Pipeline(nobody)
    try:
        topic = TopicNames(roles.namespace).jobs("default")
        with pytest.raises(EnqueueError, match=f"Kafka user {name} lacks WRITE on TOPIC {topic} "):
            app.enqueue("noop", {"n": 3}, wait=True)
    finally:
        app.close()


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
    assert wait_for(lambda: started(recording, job_id), 60), worker.log()
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
    worker = launcher.start()
    schedulers = SchedulerFactory(roles.users[Role.SCHEDULER], tmp_path)
    env = {**roles.env(Role.SCHEDULER), **scheduler_env(horizon_s=2, wait_tiers_s=[1, 3])}
    # With an app whose schedule is declared in code: the leader publishes it, then fires it.
    scheduler = schedulers.start(env, app=CRON_APP)
    try:
        app = Pipeline(roles.users[Role.PRODUCER])
        try:
            job_id = app.enqueue("noop", {"n": 8}, delay=1, wait=True)
        finally:
            app.close()
        ran = wait_for(lambda: started(recording, job_id), 60)
        # Which side held the delayed job back: whether it reached a job topic (released by
        # the scheduler), and both sides' logs (the scheduler's without its cron fires).
        assert ran, (
            f"released to a job topic: {job_arrives(roles.superuser, 'noop', 10, job_id)}\n"
            f"{_without_fires(scheduler.output())[-6000:]}\n--- worker ---\n{worker.log_tail()}"
        )
        fired = job_arrives(roles.superuser, "cron.declared", 60)
        assert fired, scheduler.output()[-3000:]
        assert "AUTHORIZATION" not in scheduler.output()
    finally:
        scheduler.kill()


def _without_fires(log: str) -> str:
    """A scheduler's log without its cron fires' lines (one every second or two)."""
    return "\n".join(line for line in log.splitlines() if "cron" not in line.lower())


def job_arrives(
    settings: Settings, job_type: str, timeout: float, job_id: str | None = None
) -> bool:
    """Whether a job of ``job_type`` (of id ``job_id``, if given) reaches a priority topic
    within ``timeout`` seconds."""
    consumer = Consumer(
        {
            **settings.client_config(),
            "group.id": f"{settings.namespace}.test-reader",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    codec = JobCodec()
    deadline = time.monotonic() + timeout
    try:
        consumer.subscribe(TopicNames(settings.namespace).all_jobs())
        while time.monotonic() < deadline:
            for message in consumer.consume(500, 0.5):
                if message.error() is not None:
                    continue
                job = codec.decode(message.value() or b"")
                if job.type == job_type and job_id in (None, job.id):
                    return True
        return False
    finally:
        consumer.close()


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


def test_the_worker_retries_and_restores_its_idempotency_keys(
    roles: Roles, workers: tuple[WorkerLauncher, Recording]
) -> None:
    # The retry relay (its own group and transactional producer) and the dedup changelog (written
    # in the worker's transaction, read back by the next owner) run as the worker role too.
    launcher, recording = workers
    first = launcher.start()
    app = Pipeline(roles.users[Role.PRODUCER])
    try:
        flaky = app.enqueue("flaky", {"n": 10, "failures": 1}, wait=True)
        keyed = app.enqueue("noop", {"n": 11}, idempotency_key="order-11", wait=True)

        def finished() -> bool:
            recording.refresh()
            return {flaky, keyed} <= recording.finished_ids

        assert wait_for(finished, 60), first.log_tail()
        assert [e.kind for e in recording.events if e.job_id == flaky] == ["S", "F", "S", "E"]
        first.terminate()
        assert first.wait(timeout=60) == 0, first.log_tail()

        second = launcher.start()
        again = app.enqueue("noop", {"n": 12}, idempotency_key="order-11", wait=True)
        marker = app.enqueue("noop", {"n": 13}, key="order-11", wait=True)
    finally:
        app.close()
    assert wait_for(lambda: started(recording, marker), 60), second.log_tail()
    assert not started(recording, again), "a restored key ran again"
    assert "AUTHORIZATION" not in first.log() + second.log()


@pytest.mark.slow  # the operator's role runs by default in the replay and status test
def test_the_operator_serves_the_dashboard(
    roles: Roles, workers: tuple[WorkerLauncher, Recording]
) -> None:
    from starlette.testclient import TestClient

    from pipeline_web import create_app

    launcher, _ = workers
    launcher.start()
    app = Pipeline(roles.users[Role.PRODUCER])
    try:
        job_id = app.enqueue("doomed", {"n": 14, "fatal": True}, wait=True)
    finally:
        app.close()
    operator = roles.users[Role.OPERATOR]
    loopback = ("127.0.0.1", 50000)  # no credentials set: the dashboard serves this machine only
    with TestClient(create_app(operator), base_url="http://127.0.0.1", client=loopback) as client:
        pages: list[str] = []

        def listed() -> bool:
            page = client.get("/dead-letters", params={"type": "doomed"})
            assert page.status_code == 200, page.text
            pages.append(page.text)
            return "job 14 cannot succeed" in page.text  # the letter's error

        assert wait_for(listed, 60), pages[-1]

        def counted() -> bool:  # the overview's reading: backlogs, groups, workers, letters
            page = client.get("/")
            assert "Kafka could not be read" not in page.text, page.text
            pending = re.search(r'id="dead-letters-pending">([0-9,]+)<', page.text)
            return pending is not None and int(pending[1].replace(",", "")) >= 1

        assert wait_for(counted, 60)
        for path in ("/workers", "/schedules", f"/jobs?id={job_id}"):
            page = client.get(path)
            assert page.status_code == 200, (path, page.text)
            assert "Kafka could not be read" not in page.text, (path, page.text)


@pytest.mark.slow  # the worker's restore with its role runs by default (the test above)
def test_a_worker_refused_its_restore_stops_naming_the_acl(
    roles: Roles, secure_cluster: DevCluster, workers: tuple[WorkerLauncher, Recording]
) -> None:
    launcher, recording = workers
    first = launcher.start()
    app = Pipeline(roles.users[Role.PRODUCER])
    try:
        keyed = app.enqueue("noop", {"n": 15}, idempotency_key="order-15", wait=True)
    finally:
        app.close()
    assert wait_for(lambda: started(recording, keyed), 60), first.log_tail()
    first.terminate()
    assert first.wait(timeout=60) == 0, first.log_tail()

    name = f"{roles.namespace}-norestore"
    security = secure_cluster.add_user(name)
    restore_group = f"{TopicNames(roles.namespace).dedup}.restore"
    rules = plan_acls(Role.WORKER, f"User:{name}", roles.superuser)
    apply_acls(roles.superuser, [rule for rule in rules if rule.name != restore_group])
    env = client_env(roles.superuser.bootstrap_servers, security)
    second = launcher.start(env=env)
    code = second.wait(timeout=90)
    assert code != 0, second.log_tail()
    lacks = f"Kafka user {name} lacks DESCRIBE on GROUP {restore_group} "
    assert lacks in second.log(), second.log_tail()
    assert second.log().count("could not restore the idempotency keys") == 0, second.log_tail()


def test_the_operator_replays_undecodable_messages_where_they_came_from(roles: Roles) -> None:
    # What the retry relay or the scheduler could not decode is dead-lettered as raw bytes,
    # and a replay sends them back byte for byte to their retry tier or deferred topic.
    names = TopicNames(roles.namespace)
    sources = [names.retry(0), names.deferred, deferred_tier_topic(roles.namespace, 0)]
    letters = [
        DeadLetter(
            reason="decode_error",
            message="undecodable",
            source_topic=topic,
            source_partition=0,
            source_offset=0,
            raw_value=b"raw bytes",
            raw_key=b"raw-key",
        )
        for topic in sources
    ]
    producer = Producer(roles.superuser.client_config())
    for letter in letters:
        producer.produce(names.dlq, DeadLetterCodec().encode(letter))
    assert producer.flush(10) == 0
    ids = [arg for letter in letters for arg in ("--id", letter.id)]
    replay = ["dlq", "replay", *ids, "--yes", "--json"]
    replayed = CliRunner().invoke(cli, replay, env=roles.env(Role.OPERATOR))
    assert replayed.exit_code == 0, replayed.output
    assert all(letter.id in replayed.stdout for letter in letters), replayed.stdout
