"""The backlog read (``pipeline status``, the exporter) on the secured cluster, refused a job
topic by an ACL: it names the ACL at once, rather than waiting out its timeout for a fetch
that cannot succeed (READ) or calling a topic it may not see missing (DESCRIBE)."""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined, unused-ignore]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from pipeline import Pipeline, Settings
from pipeline._aclapply import apply_acls
from pipeline._acls import Role, plan_acls
from pipeline._admin import apply_topics
from pipeline._backlog import read_backlog
from pipeline._errors import NotAuthorizedError
from pipeline._topics import TopicNames
from tests.waiting import wait_for

if TYPE_CHECKING:
    from pipeline_cli.devbroker import DevCluster

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def superuser(secure_cluster: DevCluster) -> Settings:
    """A namespace of its own, its topics applied, and one job waiting on its high priority:
    the backlog read fetches that job to date it."""
    settings = Settings(
        bootstrap_servers=secure_cluster.bootstrap_servers,
        namespace=f"refused{uuid.uuid4().hex[:8]}",
        security=secure_cluster.security(),
    )
    apply_topics(settings)
    app = Pipeline(settings)
    try:
        app.enqueue("noop", {"n": 1}, priority="high", wait=True)
    finally:
        app.close()
    return settings


def operator_denied(
    superuser: Settings, secure_cluster: DevCluster, topic: str, operation: AclOperation
) -> Settings:
    """A new user with the operator role's ACLs, denied ``operation`` on ``topic``."""
    name = f"{superuser.namespace}-no-{operation.name.lower()}"
    security = secure_cluster.add_user(name)
    principal = f"User:{name}"
    apply_acls(superuser, plan_acls(Role.OPERATOR, principal, superuser))
    rule = (
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        principal,
        "*",
        operation,
        AclPermissionType.DENY,
    )
    admin = AdminClient(dict(superuser.client_config()))
    for future in admin.create_acls([AclBinding(*rule)], request_timeout=15).values():
        future.result(20)
    query = AclBindingFilter(*rule)
    # The broker's authorizer answers describe_acls: once it lists the rule, it enforces it.
    assert wait_for(lambda: bool(admin.describe_acls(query, request_timeout=10).result(15)), 15)
    return superuser.model_copy(update={"security": security})


@pytest.mark.parametrize("operation", [AclOperation.READ, AclOperation.DESCRIBE])
def test_a_job_topic_the_reader_is_refused_is_named_at_once(
    superuser: Settings, secure_cluster: DevCluster, operation: AclOperation
) -> None:
    high = TopicNames(superuser.namespace).jobs("high")
    refused = operator_denied(superuser, secure_cluster, high, operation)
    user = refused.security.sasl_username
    started = time.monotonic()
    lacks = f"Kafka user {user} lacks {operation.name} on TOPIC {high} "
    with pytest.raises(NotAuthorizedError, match=lacks):
        read_backlog(refused, timeout=TIMEOUT_S)
    assert time.monotonic() - started < TIMEOUT_S / 3, "refused at once, not at the timeout"
