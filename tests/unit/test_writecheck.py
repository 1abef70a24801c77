"""The start's check that this client may write every topic of its role (``_writecheck``),
against a fake admin client's answers to DescribeTopics with authorized operations."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicCollection

# confluent-kafka's admin package does not declare its re-exports to type checkers.
from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined, unused-ignore]
from pydantic import SecretStr

from pipeline import Settings
from pipeline._acls import (
    Operation,
    PatternKind,
    ResourceKind,
    Role,
    plan_acls,
    written_topics,
)
from pipeline._adminsession import AdminSession
from pipeline._errors import NotAuthorizedError
from pipeline._settings import SecuritySettings
from pipeline._topics import TopicNames
from pipeline._writecheck import check_writes

NS = "acme"
NAMES = TopicNames(NS)
EVERY = list(AclOperation)[3:]
"""What a cluster without an authorizer answers: every operation on a topic (READ onwards)."""
OWN = [AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE]


@dataclass
class Description:
    """What ``describe_topics`` gives for a topic: its ``authorized_operations``."""

    authorized_operations: list[Any] | None


Answer = list[Any] | None | KafkaError
"""A topic's operations (None: not said), or the error its future raises."""


class FakeAdmin:
    """An admin client whose ``describe_topics`` answers from ``answers`` (default: ``OWN``)."""

    def __init__(self, answers: Mapping[str, Answer]) -> None:
        self.answers = answers
        self.asked: list[str] = []
        self.with_operations: bool | None = None

    def describe_topics(
        self,
        topics: TopicCollection,
        *,
        request_timeout: float,
        include_authorized_operations: bool,
    ) -> dict[str, concurrent.futures.Future[Description]]:
        self.with_operations = include_authorized_operations
        futures = {}
        for name in topics.topic_names:
            self.asked.append(name)
            future: concurrent.futures.Future[Description] = concurrent.futures.Future()
            answer = self.answers.get(name, OWN)
            if isinstance(answer, KafkaError):
                future.set_exception(KafkaException(answer))
            else:
                future.set_result(Description(answer))
            futures[name] = future
        return futures

    def poll(self, timeout: float) -> int:
        return 0


def settings(**kwargs: Any) -> Settings:
    security = SecuritySettings(
        protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="alice",
        sasl_password=SecretStr("s3cret"),
    )
    return Settings(namespace=NS, topics={"retry_delays_s": [1, 5]}, security=security, **kwargs)


def check(answers: Mapping[str, Answer], role: Role = Role.WORKER, **kwargs: Any) -> FakeAdmin:
    config = settings(**kwargs)
    session = AdminSession(config, timeout=5.0)
    admin = FakeAdmin(answers)
    session.client = admin  # type: ignore[assignment]
    check_writes(config, role, session=session)
    return admin


def refused(*topics: str) -> dict[str, Answer]:
    return dict.fromkeys(topics, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))


def test_the_topics_checked_are_those_the_roles_acls_allow_to_write() -> None:
    config = settings()
    worker = written_topics(Role.WORKER, config)
    for topic in (NAMES.dlq, NAMES.retry(0), NAMES.retry(1), NAMES.deferred, NAMES.events):
        assert topic in worker
    assert {NAMES.dedup, NAMES.workers, *NAMES.all_jobs()} <= set(worker)
    assert NAMES.schedules not in worker
    scheduler = written_topics(Role.SCHEDULER, config)
    assert {NAMES.dlq, NAMES.scheduler_state, NAMES.schedules, *NAMES.all_jobs()} <= set(scheduler)
    assert NAMES.events not in scheduler
    assert NAMES.deferred not in scheduler  # read, never written: its wait tiers are
    assert f"{NS}.deferred.0" in scheduler
    assert written_topics(Role.ADMIN, config) == []
    for role in (Role.WORKER, Role.SCHEDULER):
        rules = plan_acls(role, "User:alice", config)
        for topic in written_topics(role, config):
            assert any(
                r.resource is ResourceKind.TOPIC
                and r.operation is Operation.WRITE
                and (
                    topic == r.name
                    or (r.pattern is PatternKind.PREFIXED and topic.startswith(r.name))
                )
                for r in rules
            ), topic


def test_a_worker_that_may_write_every_topic_of_its_role_starts() -> None:
    admin = check({})
    assert admin.with_operations is True
    assert admin.asked == written_topics(Role.WORKER, settings())


def test_a_topic_it_may_not_describe_is_one_it_may_not_write() -> None:
    with pytest.raises(NotAuthorizedError) as caught:
        check(refused(NAMES.dlq))
    error = caught.value
    assert (error.resource, error.name, error.operation, error.user) == (
        "TOPIC",
        NAMES.dlq,
        "WRITE",
        "alice",
    )
    assert f"Kafka user alice lacks WRITE on TOPIC {NAMES.dlq} " in str(error)
    assert "`pipeline acls apply --role worker --principal User:alice`" in str(error)


def test_operations_without_write_are_refused_and_the_first_is_named() -> None:
    answers: dict[str, Answer] = {
        NAMES.events: [AclOperation.READ, AclOperation.DESCRIBE],
        **refused(NAMES.workers),  # after the events in the order of the topics
    }
    with pytest.raises(NotAuthorizedError, match=f"lacks WRITE on TOPIC {NAMES.events} "):
        check(answers)
    with pytest.raises(NotAuthorizedError, match=f"lacks WRITE on TOPIC {NAMES.retry(1)} "):
        check(refused(NAMES.retry(1)))


def test_the_scheduler_checks_its_own_topics() -> None:
    with pytest.raises(NotAuthorizedError, match="--role scheduler "):
        check(refused(NAMES.scheduler_state), Role.SCHEDULER)
    check(refused(NAMES.events, NAMES.dedup), Role.SCHEDULER)  # not its topics


@pytest.mark.parametrize(
    "answer",
    [EVERY, None, [AclOperation.ALL], KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)],
    ids=["no authorizer: every operation", "not said", "ALL", "missing"],
)
def test_what_kafka_does_not_refuse_is_allowed(answer: Answer) -> None:
    check({topic: answer for topic in written_topics(Role.WORKER, settings())})


def test_topics_the_settings_turn_off_are_not_checked() -> None:
    off = refused(NAMES.events, NAMES.workers)
    admin = check(off, events="off", worker={"heartbeat_interval_s": 0})
    assert NAMES.events not in admin.asked
    assert NAMES.workers not in admin.asked
    with pytest.raises(NotAuthorizedError, match=NAMES.events):
        check(off)


def test_no_answer_in_time_starts_unchecked(caplog: pytest.LogCaptureFixture) -> None:
    class Silent(FakeAdmin):
        def describe_topics(
            self, topics: TopicCollection, **kwargs: Any
        ) -> dict[str, concurrent.futures.Future[Description]]:
            return {name: concurrent.futures.Future() for name in topics.topic_names}

    config = settings()
    session = AdminSession(config, timeout=0.1)
    session.client = Silent({})  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="pipeline.kafka.admin"):
        check_writes(config, Role.WORKER, session=session)
    assert "could not check that this client may write its topics" in caplog.text


def test_heartbeats_it_may_not_write_only_warn(caplog: pytest.LogCaptureFixture) -> None:
    """A refused heartbeat is dropped and the worker runs on: ACLs written by hand without
    them must not stop a worker that did run."""
    with caplog.at_level(logging.WARNING, logger="pipeline.kafka.admin"):
        check(refused(NAMES.workers))
    assert f"this client may not write {NAMES.workers}: no heartbeat" in caplog.text
    with pytest.raises(NotAuthorizedError, match=f"lacks WRITE on TOPIC {NAMES.dlq} "):
        check(refused(NAMES.workers, NAMES.dlq))


def test_topics_the_process_does_not_write_are_not_checked() -> None:
    """A worker whose application keeps its idempotency keys in its own store never writes
    the changelog: ACLs without it must not stop the worker."""
    config = settings()
    session = AdminSession(config, timeout=5.0)
    admin = FakeAdmin(refused(NAMES.dedup))
    session.client = admin  # type: ignore[assignment]
    check_writes(config, Role.WORKER, session=session, unused=[NAMES.dedup])
    assert NAMES.dedup not in admin.asked
    with pytest.raises(NotAuthorizedError, match=NAMES.dedup):
        check(refused(NAMES.dedup))
