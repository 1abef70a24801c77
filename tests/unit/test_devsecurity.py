"""The secured dev cluster without a broker: its certificates, broker settings, client settings."""

from __future__ import annotations

import json
import re
import stat
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from pipeline._errors import ConfigurationError
from pipeline._settings import SecuritySettings, Settings
from pipeline_cli import devbroker
from pipeline_cli._devsecurity import DevSecurity
from pipeline_cli._devusers import client_env
from pipeline_cli._main import cli
from pipeline_cli.devbroker import DevBrokerError, node_properties, plan_nodes

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def material(tmp_path: Path) -> DevSecurity:
    created = DevSecurity(tmp_path / "security")
    created.create()
    return created


def test_the_broker_certificate_is_signed_by_the_ca_for_localhost(material: DevSecurity) -> None:
    ca = x509.load_pem_x509_certificate(material.ca_file.read_bytes())
    chain = x509.load_pem_x509_certificates(material.keystore_file.read_bytes())
    assert len(chain) == 2
    broker = chain[0]
    broker.verify_directly_issued_by(ca)
    san = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    usage = broker.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert broker.subject.rfc4514_string() == f"CN={devbroker.BROKER_CN}"
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # The keystore holds the broker's unencrypted PKCS#8 key: a PEM keystore Kafka reads as is.
    assert b"-----BEGIN PRIVATE KEY-----" in material.keystore_file.read_bytes()
    assert isinstance(broker.public_key(), ec.EllipticCurvePublicKey)


def test_secrets_are_readable_by_their_owner_only(material: DevSecurity) -> None:
    for private in (material.keystore_file, material.ca_key_file, material.password_file):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
    assert stat.S_IMODE(material.dir.stat().st_mode) == 0o700
    assert len(material.admin_password()) == 32


def test_secured_node_properties(material: DevSecurity, tmp_path: Path) -> None:
    nodes = plan_nodes(3, 19092, tmp_path)
    props = node_properties(nodes[1], nodes, material)
    assert props["listeners"] == "SASL_SSL://localhost:19094,CONTROLLER://localhost:19095"
    assert props["advertised.listeners"] == "SASL_SSL://localhost:19094"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SSL"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert props["ssl.keystore.type"] == props["ssl.truststore.type"] == "PEM"
    assert (
        props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    )
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == f"User:admin;User:CN={devbroker.BROKER_CN}"
    jaas = props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert f'password="{material.admin_password()}";' in jaas
    assert material.format_args() == [
        "--add-scram",
        f"SCRAM-SHA-512=[name=admin,password={material.admin_password()}]",
    ]
    assert "PLAINTEXT" not in props["listeners"]


def test_the_printed_environment_builds_the_same_settings(
    material: DevSecurity, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = client_env("localhost:19092", material.client())
    assert list(env) == [
        "PIPELINE_BOOTSTRAP_SERVERS",
        "PIPELINE_SECURITY__PROTOCOL",
        "PIPELINE_SECURITY__SASL_MECHANISM",
        "PIPELINE_SECURITY__SASL_USERNAME",
        "PIPELINE_SECURITY__SASL_PASSWORD",
        "PIPELINE_SECURITY__SSL_CA_LOCATION",
    ]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.bootstrap_servers == "localhost:19092"
    assert settings.security.librdkafka() == material.client().librdkafka()
    assert settings.client_config()["sasl.password"] == material.admin_password()


def write_layout(data_dir: Path, *, secure: bool) -> None:
    layout = {
        "nodes": 1,
        "base_port": 19092,
        "cluster_id": "AAAAAAAAAAAAAAAAAAAAAA",
        "heap": "1G",
        "kafka_version": devbroker.KAFKA_VERSION,
        "secure": secure,
    }
    (data_dir / "cluster.json").write_text(json.dumps(layout))


def test_a_plain_data_dir_is_not_started_secured(tmp_path: Path) -> None:
    write_layout(tmp_path, secure=False)
    with pytest.raises(DevBrokerError, match="holds a 1-node cluster on port 19092"):
        devbroker.up(data_dir=tmp_path, secure=True)
    assert devbroker.security(tmp_path) == SecuritySettings()
    assert devbroker.client_settings(tmp_path) == {
        "PIPELINE_BOOTSTRAP_SERVERS": "localhost:19092",
        "PIPELINE_SECURITY__PROTOCOL": "PLAINTEXT",
    }
    with pytest.raises(DevBrokerError, match="holds no secured cluster"):
        devbroker.add_user("alice", data_dir=tmp_path)


def test_a_secured_layout_gives_the_admin_settings(tmp_path: Path) -> None:
    write_layout(tmp_path, secure=True)
    DevSecurity(tmp_path / "security").create()
    admin = devbroker.security(tmp_path)
    assert admin.protocol == "SASL_SSL"
    assert admin.sasl_username == "admin"
    assert admin.ssl_ca_location == tmp_path.resolve() / "security" / "ca.pem"
    assert devbroker.status(tmp_path).to_dict()["secure"] is True


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("admin", "'admin' is the cluster's own super user"),
        ("", "invalid user name ''"),
        ("bob smith", "invalid user name 'bob smith'"),
        ("a,b", "without spaces, commas or '='"),
    ],
)
def test_a_user_name_the_cluster_must_not_take_is_a_usage_error(
    tmp_path: Path, name: str, says: str
) -> None:
    """`dev user add admin` changed the super user's password: `dev env`, the saved password
    and the brokers' own login were wrong from then on. `''` was a traceback."""
    write_layout(tmp_path, secure=True)
    DevSecurity(tmp_path / "security").create()
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        devbroker.add_user(name, data_dir=tmp_path)
    result = CliRunner().invoke(cli, ["dev", "user", "add", name, "--data-dir", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert says in result.output
