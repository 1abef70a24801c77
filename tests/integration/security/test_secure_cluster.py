"""A secured local cluster (``pipeline dev up --secure``) against real clients.

The admin's printed settings apply the topics and carry a job there and back; a wrong password,
a PLAINTEXT client and a user without ACLs are each refused. One secured node serves the whole
session (``secure_cluster``); starting it is the cost.
"""

from __future__ import annotations

import json
import stat
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined, unused-ignore]
from pydantic import SecretStr

from pipeline import Pipeline, Settings
from pipeline_cli import cli, devbroker
from tests.waiting import wait_for

if TYPE_CHECKING:
    from pipeline_cli.devbroker import DevCluster

REFUSED_WITHIN_S = 15.0
"""A refused client is given this long to fail; a follow-up makes it fail at once."""


def refused(conf: dict[str, str]) -> list[KafkaError]:
    """Connects with ``conf``: the errors the client reports within REFUSED_WITHIN_S, after
    checking that a metadata request fails too."""
    errors: list[KafkaError] = []
    client: dict[str, Any] = {**conf, "log_level": 0, "error_cb": errors.append}
    admin = AdminClient(client)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)

    def reported() -> bool:
        admin.poll(0.1)  # serves error_cb
        return bool(errors)

    assert wait_for(reported, REFUSED_WITHIN_S), "the client reported no error"
    return errors


def admin_password(cluster: DevCluster) -> str:
    return (cluster.data_dir / "security" / "admin.password").read_text().strip()


def test_the_printed_settings_apply_topics_and_carry_a_job(
    secure_cluster: DevCluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    up = runner.invoke(cli, ["dev", "up", "--data-dir", str(secure_cluster.data_dir), "--json"])
    assert up.exit_code == 0, up.output
    report = json.loads(up.stdout)
    assert report["already_running"] is True
    assert report["secure"] is True
    env = report["client_settings"]
    assert env == {
        "PIPELINE_BOOTSTRAP_SERVERS": secure_cluster.bootstrap_servers,
        "PIPELINE_SECURITY__PROTOCOL": "SASL_SSL",
        "PIPELINE_SECURITY__SASL_MECHANISM": "SCRAM-SHA-512",
        "PIPELINE_SECURITY__SASL_USERNAME": "admin",
        "PIPELINE_SECURITY__SASL_PASSWORD": admin_password(secure_cluster),
        "PIPELINE_SECURITY__SSL_CA_LOCATION": str(secure_cluster.data_dir / "security/ca.pem"),
    }
    for name, value in {**env, "PIPELINE_NAMESPACE": namespace}.items():
        monkeypatch.setenv(name, value)

    applied = runner.invoke(cli, ["topics", "apply"])
    assert applied.exit_code == 0, applied.output

    settings = Settings()
    app = Pipeline(settings)
    try:
        job_id = app.enqueue("secured", {"n": 1}, wait=True)
    finally:
        app.close()
    consumer = Consumer(
        {
            **settings.client_config(),
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe([f"{namespace}.jobs.default"])
        message = None
        deadline = time.monotonic() + 30
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(1.0)
        assert message is not None, "the job was not read back within 30 s"
        assert message.error() is None, message.error()
        assert app.codec.decode(message.value() or b"").id == job_id
    finally:
        consumer.close()


def test_a_wrong_password_is_refused(secure_cluster: DevCluster) -> None:
    update = {"sasl_password": SecretStr("not-the-password")}
    wrong = secure_cluster.security().model_copy(update=update)
    errors = refused({**wrong.librdkafka(), "bootstrap.servers": secure_cluster.bootstrap_servers})
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}, errors
    assert any("SCRAM-SHA-512" in e.str() for e in errors), errors


def test_a_plaintext_client_is_refused_on_the_tls_port(secure_cluster: DevCluster) -> None:
    errors = refused({"bootstrap.servers": secure_cluster.bootstrap_servers})
    # A TLS server reads a PLAINTEXT request as a broken handshake and hangs up.
    assert {e.code() for e in errors} <= {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}


def test_a_new_user_without_acls_may_not_create_topics(secure_cluster: DevCluster) -> None:
    name = f"user-{uuid.uuid4().hex[:8]}"
    user = secure_cluster.add_user(name)
    assert user.sasl_username == name
    assert user.sasl_password is not None
    assert user.sasl_password.get_secret_value() != admin_password(secure_cluster)
    admin = AdminClient(
        {**user.librdkafka(), "bootstrap.servers": secure_cluster.bootstrap_servers}
    )
    # It gets in (the metadata lists no topic it may not see), but may create nothing.
    assert admin.list_topics(timeout=15).topics == {}
    topic = f"denied-{uuid.uuid4().hex[:8]}"
    future = admin.create_topics([NewTopic(topic, 1, 1)])[topic]
    with pytest.raises(KafkaException) as caught:
        future.result(timeout=30)
    assert caught.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_the_cli_adds_users_and_prints_the_settings(secure_cluster: DevCluster) -> None:
    runner = CliRunner()
    where = ["--data-dir", str(secure_cluster.data_dir)]
    name = f"cli-{uuid.uuid4().hex[:8]}"
    added = runner.invoke(cli, ["dev", "user", "add", name, "--password", "s3cret", *where])
    assert added.exit_code == 0, added.output
    assert f"export PIPELINE_SECURITY__SASL_USERNAME={name}\n" in added.stdout
    assert "export PIPELINE_SECURITY__SASL_PASSWORD=s3cret\n" in added.stdout
    update = {"sasl_username": name, "sasl_password": SecretStr("s3cret")}
    user = secure_cluster.security().model_copy(update=update)
    conf: dict[str, str | int | float | bool] = {
        **user.librdkafka(),
        "bootstrap.servers": secure_cluster.bootstrap_servers,
        "log_level": 0,
    }
    assert AdminClient(conf).list_topics(timeout=15).topics == {}

    shown = runner.invoke(cli, ["dev", "env", "--json", *where])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == secure_cluster.client_settings()


def test_the_password_is_kept_private_and_out_of_the_output(secure_cluster: DevCluster) -> None:
    secret = secure_cluster.data_dir / "security" / "admin.password"
    password = secret.read_text().strip()
    assert len(password) >= 32
    for private in (secret, secure_cluster.data_dir / "security" / "broker.pem"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    for node in secure_cluster.nodes:
        assert stat.S_IMODE(node.properties_file.stat().st_mode) == 0o600
        assert password not in node.log_file.read_text(errors="replace")

    up = CliRunner().invoke(cli, ["dev", "up", "--data-dir", str(secure_cluster.data_dir)])
    assert up.exit_code == 0, up.output
    assert password not in up.output
    assert "export PIPELINE_SECURITY__PROTOCOL=SASL_SSL\n" in up.stdout
    assert f'export PIPELINE_SECURITY__SASL_PASSWORD="$(cat {secret})"\n' in up.stdout
    assert up.stdout.splitlines()[-1] == secure_cluster.bootstrap_servers


def test_a_secured_data_dir_is_not_started_plain(secure_cluster: DevCluster) -> None:
    with pytest.raises(devbroker.DevBrokerError, match="secured 1-node cluster"):
        devbroker.up(data_dir=secure_cluster.data_dir, secure=False)
