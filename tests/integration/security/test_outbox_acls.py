"""The outbox relay on a secured cluster, with the ACLs docs/outbox.md lists and its topic
created beforehand: it needs no ``Create`` permission.

Kafka checks ``Create`` before it checks whether a topic exists: a relay that asked to create
its topic every time it became active was refused for ever, and published nothing.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from pipeline import Pipeline, Settings
from pipeline._aclapply import apply_acls
from pipeline._acls import AclRule, Operation, PatternKind, ResourceKind, Role, plan_acls
from pipeline._admin import apply_topics
from pipeline.outbox import OutboxRelay, connect, create_table
from pipeline.outbox._progress import RelayProgress, progress_topic
from tests.integration.outbox.relays import pending, relay_in_thread
from tests.waiting import wait_for

if TYPE_CHECKING:
    from pathlib import Path

    from pipeline_cli.devbroker import DevCluster

TABLE = "pipeline_outbox"


def test_a_relay_without_create_publishes_through_its_topic_made_beforehand(
    secure_cluster: DevCluster, tmp_path: Path
) -> None:
    namespace = f"outbox{uuid.uuid4().hex[:8]}"
    admin = Settings(
        bootstrap_servers=secure_cluster.bootstrap_servers,
        namespace=namespace,
        security=secure_cluster.security(),
    )
    apply_topics(admin)
    RelayProgress(admin, TABLE).ensure_topic(30.0)  # the operator creates it beforehand

    name = f"{namespace}-relay"
    principal = f"User:{name}"
    relay_topic = progress_topic(namespace, TABLE)
    rules = [
        *plan_acls(Role.PRODUCER, principal, admin),
        *(
            AclRule(ResourceKind.TOPIC, PatternKind.LITERAL, relay_topic, operation, principal)
            for operation in (Operation.WRITE, Operation.READ, Operation.DESCRIBE)
        ),
        *(
            AclRule(
                ResourceKind.TRANSACTIONAL_ID,
                PatternKind.LITERAL,
                relay_topic,
                operation,
                principal,
            )
            for operation in (Operation.WRITE, Operation.DESCRIBE)
        ),
    ]
    assert not any(rule.operation is Operation.CREATE for rule in rules)
    apply_acls(admin, rules)
    relay_settings = admin.model_copy(update={"security": secure_cluster.add_user(name)})

    dsn = f"sqlite:///{tmp_path / 'orders.db'}"
    connection, _ = connect(dsn)
    try:
        create_table(connection)
        Pipeline(relay_settings).outbox(connection).enqueue_many(
            "email.send", [{"n": n} for n in range(3)]
        )
        connection.commit()
    finally:
        connection.close()

    with relay_in_thread(OutboxRelay(relay_settings, dsn)) as relay:
        assert relay.active.wait(60), "the relay never became active"
        assert wait_for(lambda: pending(dsn) == 0, 60), "the relay published nothing"
    assert relay.relayed == 3
