"""The clients of a secured local cluster: the admin's settings, their PIPELINE_* form, users.

A follow-up gives each role (producer, worker, scheduler, operator) a user of its own with ACLs;
:func:`add_user` is what it builds on.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from pipeline._errors import ConfigurationError
from pipeline._newclient import client
from pipeline._settings import SecuritySettings

from ._devdata import _Layout, _read_layout, default_data_dir
from ._devnodes import plan_nodes
from ._devprocs import DevBrokerError
from ._devsecurity import ADMIN_USER, SCRAM_ITERATIONS, SECURITY_DIR, DevSecurity, new_password

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._devprocs import DevNode


def _secured(data_dir: Path | None) -> tuple[Path, _Layout]:
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    layout = _read_layout(data_dir) if data_dir.is_dir() else None
    if layout is None or not layout.secure:
        raise DevBrokerError(
            f"{data_dir} holds no secured cluster; start one with `pipeline dev up --secure`"
        )
    return data_dir, layout


def security(data_dir: Path | None = None) -> SecuritySettings:
    """The admin's client settings of the cluster in ``data_dir`` (``PLAINTEXT`` if not
    secured): ``SASL_SSL``, ``SCRAM-SHA-512``, user ``admin``, its password, the CA file."""
    data_dir = (data_dir or default_data_dir()).expanduser().resolve()
    layout = _read_layout(data_dir) if data_dir.is_dir() else None
    if layout is None or not layout.secure:
        return SecuritySettings()
    return DevSecurity(data_dir / SECURITY_DIR).client()


def add_user(
    name: str, password: str | None = None, data_dir: Path | None = None, *, timeout: float = 30.0
) -> SecuritySettings:
    """Creates (or changes the password of) SCRAM-SHA-512 user ``name`` in the running secured
    cluster of ``data_dir`` and returns its client settings, once every node accepts it.

    ``password`` defaults to a random one. The user is allowed nothing until ACLs grant it
    something (``allow.everyone.if.no.acl.found=false``).
    """
    _check_name(name)
    data_dir, layout = _secured(data_dir)
    planned = plan_nodes(layout.nodes, layout.base_port, data_dir)
    servers = ",".join(f"localhost:{n.port}" for n in planned)
    admin = DevSecurity(data_dir / SECURITY_DIR).client()
    return _create_user(servers, admin, name, password or new_password(), planned, timeout)


def _check_name(name: str) -> None:
    """A usage error (exit 2) for a name the cluster cannot take or must not."""
    if not name or name != name.strip() or any(c.isspace() or c in ",=" for c in name):
        raise ConfigurationError(
            f"invalid user name {name!r}: give a non-empty name without spaces, commas or '='"
        )
    if name == ADMIN_USER:
        # Its password is in security/admin.password, which the brokers log in with and
        # `pipeline dev env` prints: changed here, both would be wrong.
        raise ConfigurationError(
            f"user {ADMIN_USER!r} is the cluster's own super user (its password is kept in "
            f"{SECURITY_DIR}/admin.password): give another name"
        )


def client_env(bootstrap_servers: str, security: SecuritySettings) -> dict[str, str]:
    """The ``PIPELINE_*`` environment variables of a client with these settings (secrets too)."""
    env = {"PIPELINE_BOOTSTRAP_SERVERS": bootstrap_servers}
    for name, value in security.model_dump().items():
        if value is None:
            continue
        text = value.get_secret_value() if isinstance(value, SecretStr) else str(value)
        env[f"PIPELINE_SECURITY__{name.upper()}"] = text
    return env


def _create_user(
    bootstrap_servers: str,
    admin: SecuritySettings,
    name: str,
    password: str,
    nodes: Sequence[DevNode],
    timeout: float = 30.0,
) -> SecuritySettings:
    """Creates (or changes) SCRAM user ``name``, waits until every node lets it in."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **admin.librdkafka()}
    upsert = UserScramCredentialUpsertion(
        name,
        ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
        password.encode(),
    )
    admin_client = client(
        AdminClient, {**conf, "log_level": 0}
    )  # a collected one fails its futures
    try:
        for future in admin_client.alter_user_scram_credentials([upsert]).values():
            future.result(timeout)
    except KafkaException as exc:
        raise DevBrokerError(f"could not create SCRAM user {name!r}: {exc}") from exc
    except concurrent.futures.TimeoutError as exc:
        raise DevBrokerError(
            f"could not create SCRAM user {name!r}: the cluster did not answer within "
            f"{timeout:.0f}s (is it running? `pipeline dev status`)"
        ) from exc
    user = admin.model_copy(update={"sasl_username": name, "sasl_password": SecretStr(password)})
    # The credential reaches each broker through the metadata log, a moment apart.
    deadline = time.monotonic() + timeout
    for node in nodes:
        node_conf: dict[str, str | int | float | bool] = {
            **user.librdkafka(),
            "bootstrap.servers": f"localhost:{node.port}",
            "log_level": 0,
        }
        while True:
            try:
                client(AdminClient, node_conf).list_topics(
                    timeout=max(1.0, deadline - time.monotonic())
                )
                break
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise DevBrokerError(
                        f"node {node.index} did not accept user {name!r} within {timeout:.0f}s "
                        f"({exc})"
                    ) from exc
                time.sleep(0.2)
    return user
