"""A secured local cluster (``pipeline dev up --secure``): its CA, certificates, admin password
and broker settings.

Clients reach the brokers only over ``SASL_SSL`` with ``SCRAM-SHA-512``; the brokers replicate
over the same listener as the admin user; the controller listener is TLS with client
certificates (each node presents the broker certificate, whose principal is a super user). The
``StandardAuthorizer`` denies whatever no ACL allows, so a new user can do nothing until ACLs
grant it something; the admin is a super user.

The material lives in ``<data dir>/security/``: ``ca.pem`` (what clients trust), ``ca.key``,
``broker.pem`` (the brokers' key and certificate, a PEM keystore: no keytool) and
``admin.password`` (generated once, mode 0600). Nothing here prints the password: only the
client settings the caller asks for hold it. Users and client settings are in :mod:`._devusers`.
"""

from __future__ import annotations

import datetime
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from pipeline._settings import SecuritySettings

from ._devprocs import DevBrokerError

if TYPE_CHECKING:
    from ._devprocs import DevNode

SECURITY_DIR = "security"
MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
BROKER_CN = "pipeline-dev-broker"
"""The common name of the brokers' certificate: ``User:CN=pipeline-dev-broker`` on the
controller listener, a super user so the nodes may register and vote."""
SCRAM_ITERATIONS = 8192
_VALID_DAYS = 3650


def write_private(path: Path, data: bytes) -> None:
    """Writes ``data`` to a file only its owner may read, from its first byte on."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def new_password() -> str:
    """A random password: 32 URL-safe characters (nothing a JAAS or SCRAM string must escape)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True)
class DevSecurity:
    """The security material of one data dir, and the settings derived from it."""

    dir: Path

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.dir / "ca.key"

    @property
    def keystore_file(self) -> Path:
        return self.dir / "broker.pem"

    @property
    def password_file(self) -> Path:
        return self.dir / "admin.password"

    def admin_password(self) -> str:
        try:
            return self.password_file.read_text().strip()
        except OSError as exc:
            raise DevBrokerError(
                f"cannot read the admin password of the secured cluster ({exc}); "
                "start over with --fresh"
            ) from exc

    def exists(self) -> bool:
        files = (self.ca_file, self.ca_key_file, self.keystore_file, self.password_file)
        return all(f.is_file() for f in files)

    def create(self) -> None:
        """Generates the CA, the brokers' certificate and the admin password (once)."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        ca_key, ca_pem, broker_pem = _certificates()
        write_private(self.ca_key_file, ca_key)
        self.ca_file.write_bytes(ca_pem)
        write_private(self.keystore_file, broker_pem)
        write_private(self.password_file, (new_password() + "\n").encode())

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments: the admin's SCRAM credential in the metadata."""
        scram = f"{MECHANISM}=[name={ADMIN_USER},password={self.admin_password()}]"
        return ["--add-scram", scram]

    def broker_properties(self, node: DevNode) -> dict[str, str]:
        """What a node's configuration has instead of the PLAINTEXT listeners."""
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{ADMIN_USER}" password="{self.admin_password()}";'
        )
        return {
            "listeners": f"SASL_SSL://localhost:{node.port},CONTROLLER://localhost:"
            f"{node.controller_port}",
            "advertised.listeners": f"SASL_SSL://localhost:{node.port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "listener.name.controller.ssl.client.auth": "required",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore_file),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "ssl.endpoint.identification.algorithm": "https",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN_USER};User:CN={BROKER_CN}",
        }

    def client(self, username: str = ADMIN_USER, password: str | None = None) -> SecuritySettings:
        """The settings of a client of user ``username`` (the admin's password by default)."""
        return SecuritySettings(
            protocol="SASL_SSL",
            sasl_mechanism=MECHANISM,
            sasl_username=username,
            sasl_password=SecretStr(self.admin_password() if password is None else password),
            ssl_ca_location=self.ca_file,
        )


def _certificates() -> tuple[bytes, bytes, bytes]:
    """A new CA (its key, its certificate) and the brokers' key and certificate, as PEM."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as exc:
        raise DevBrokerError(
            "a secured dev cluster generates its certificates with the `cryptography` package: "
            "pip install 'kafka-pipeline[certs]'"
        ) from exc
    import ipaddress

    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=_VALID_DAYS)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = name("pipeline dev CA")
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name(BROKER_CN))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        # Server and client: the nodes present it to each other on the controller listener.
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def key_pem(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    chain = cert.public_bytes(serialization.Encoding.PEM) + ca_pem
    return key_pem(ca_key), ca_pem, key_pem(key) + chain
