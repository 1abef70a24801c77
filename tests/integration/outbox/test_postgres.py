"""The outbox on PostgreSQL: the connections, table names and rights it works with.

A real server (the ``postgres`` fixture); a broker only for the relay that must publish.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid

import psycopg
import pytest
from ops.pgserver import PostgresServer
from psycopg.conninfo import conninfo_to_dict

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline._errors import ConfigurationError
from pipeline.outbox import OutboxRelay, connect, create_table
from pipeline.outbox._lock import AdvisoryLock, lock_for, lock_key
from tests.waiting import wait_for

from .relays import pending, relay_in_thread

APP = Pipeline(Settings(bootstrap_servers="127.0.0.1:1", namespace="pg"))

_SETTING = "SELECT setting FROM pg_settings WHERE name = %s"


def _execute(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement)


def test_an_async_connection_is_refused(postgres_dsn: str) -> None:
    # Its statements are coroutines: never awaited, the row would never be written.
    async def hand_over() -> None:
        connection = await psycopg.AsyncConnection.connect(postgres_dsn)
        try:
            with pytest.raises(ConfigurationError, match=r"psycopg\.connect"):
                APP.outbox(connection)
            with pytest.raises(ConfigurationError, match=r"psycopg\.connect"):
                create_table(connection)
        finally:
            await connection.close()

    asyncio.run(hand_over())


@pytest.mark.parametrize("create", [True, False])
def test_a_relay_refuses_another_spelling_of_its_table(postgres_dsn: str, create: bool) -> None:
    # public.pipeline_outbox is pipeline_outbox: another lock key would make two active relays.
    if create:
        connection, _ = connect(postgres_dsn)
        create_table(connection)
        connection.close()
    lock = lock_for(postgres_dsn, "public.pipeline_outbox")
    try:
        with pytest.raises(ConfigurationError, match="'pipeline_outbox'"):
            lock.try_acquire()
    finally:
        lock.release()


def test_a_schema_the_plain_name_does_not_reach_is_kept(postgres_dsn: str) -> None:
    _execute(postgres_dsn, "CREATE SCHEMA jobs")
    plain, qualified = (
        AdvisoryLock(postgres_dsn, "pipeline_outbox"),
        lock_for(postgres_dsn, "jobs.pipeline_outbox"),
    )
    try:
        assert plain.try_acquire()
        assert qualified.try_acquire()  # another table: a lock of its own
    finally:
        plain.release()
        qualified.release()


@pytest.mark.parametrize("create", [True, False])
def test_two_spellings_of_one_table_on_two_search_paths_take_one_lock(
    postgres_dsn: str, create: bool
) -> None:
    # jobs.pipeline_outbox is pipeline_outbox for a session whose search_path reaches jobs:
    # one table, so one active relay, whether the table is there yet or a relay creates it.
    _execute(postgres_dsn, "CREATE SCHEMA jobs")
    if create:
        _execute(postgres_dsn, "CREATE TABLE jobs.pipeline_outbox (id BIGINT)")
    in_jobs = postgres_dsn + "?options=-csearch_path%3Djobs%2Cpublic"
    plain, qualified = (
        AdvisoryLock(in_jobs, "pipeline_outbox"),
        AdvisoryLock(postgres_dsn, "jobs.pipeline_outbox"),
    )
    try:
        assert plain.try_acquire()
        assert not qualified.try_acquire()
        assert plain.held()
        plain.release()  # its session ends on the server a moment later
        assert wait_for(qualified.try_acquire, 10), "the standby never took the lock over"
        assert not plain.try_acquire()
        assert qualified.held()
    finally:
        plain.release()
        qualified.release()


def test_a_relay_of_the_previous_release_and_a_new_one_exclude_each_other(
    postgres_dsn: str,
) -> None:
    # The previous release's relay takes the key of the name as spelled, and that key only.
    with psycopg.connect(postgres_dsn, autocommit=True) as previous:
        take = "SELECT pg_try_advisory_lock(%s)"
        assert previous.execute(take, (lock_key("pipeline_outbox"),)).fetchone() == (True,)
        lock = AdvisoryLock(postgres_dsn, "pipeline_outbox")
        try:
            assert not lock.try_acquire()
            # A standby holds neither key: another new relay is not kept waiting by it.
            other = AdvisoryLock(postgres_dsn, "pipeline_outbox")
            previous.execute("SELECT pg_advisory_unlock_all()")
            assert other.try_acquire()
            other.release()
            assert wait_for(lock.try_acquire, 10)
            assert previous.execute(take, (lock_key("pipeline_outbox"),)).fetchone() == (False,)
        finally:
            lock.release()


def test_a_relay_with_select_and_delete_rights_only_publishes(
    postgres_dsn: str, settings: Settings
) -> None:
    role = f"relay_{uuid.uuid4().hex[:8]}"
    connection, _ = connect(postgres_dsn)
    create_table(connection)
    Pipeline(settings).outbox(connection).enqueue_many("email.send", [{"n": n} for n in range(3)])
    connection.commit()
    connection.close()
    _execute(
        postgres_dsn,
        f"CREATE ROLE {role} LOGIN",
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",  # PostgreSQL 15's default, made sure
        f"GRANT SELECT, DELETE ON pipeline_outbox TO {role}",
    )
    relay_dsn = postgres_dsn.replace("postgres@", f"{role}@", 1)
    restricted, _ = connect(relay_dsn)
    try:
        create_table(restricted)  # the table is there: nothing to create, no right needed
    finally:
        restricted.close()

    apply_topics(settings)
    with relay_in_thread(OutboxRelay(settings, relay_dsn)) as relay:
        assert relay.active.wait(60), "the relay never became active"
        assert wait_for(lambda: pending(postgres_dsn) == 0, 60)
    assert relay.relayed == 3


def test_the_lock_session_is_dropped_within_a_minute_of_its_host_vanishing(
    postgres_dsn: str,
) -> None:
    # The server ends a session whose peer stopped answering keepalive probes, releasing its
    # advisory lock: idle time, then count probes an interval apart.
    lock = AdvisoryLock(postgres_dsn, "pipeline_outbox")
    try:
        assert lock.try_acquire()
        connection = lock._connection
        idle, interval, count, user_timeout_ms = (
            # pg_settings: in the setting's own unit (seconds; milliseconds for the last)
            int(connection.execute(_SETTING, (name,)).fetchone()[0])
            for name in (
                "tcp_keepalives_idle",
                "tcp_keepalives_interval",
                "tcp_keepalives_count",
                "tcp_user_timeout",
            )
        )
    finally:
        lock.release()
    assert 0 < idle + interval * count <= 60
    assert 0 < user_timeout_ms <= 60_000  # while data waits for an acknowledgement


def _keepalives_to(port: int) -> list[tuple[int, int, int, int]]:
    """(SO_KEEPALIVE, idle, interval, count) of each TCP socket of this process connected to
    ``port`` on localhost, sorted."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            duplicate = os.dup(int(name))
        except OSError:  # closed meanwhile
            continue
        try:
            sock = socket.socket(fileno=duplicate)
        except OSError:  # closed and reused meanwhile by something that is no socket
            os.close(duplicate)  # a socket() that fails leaves its descriptor open
            continue
        with sock:
            try:
                if sock.family != socket.AF_INET or sock.getpeername()[1] != port:
                    continue
            except OSError:  # not connected
                continue
            found.append(
                (
                    sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
                )
            )
    return sorted(found)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        # The lock's session (10 s, 5 s, 4) and the relay's own connection (30 s, 10 s, 3),
        # not the system's two hours of silence before a first probe.
        ("", [(1, 10, 5, 4), (1, 30, 10, 3)]),
        ("?keepalives_idle=45", [(1, 45, 5, 4), (1, 45, 10, 3)]),  # the DSN's own: kept
    ],
)
def test_the_relays_connections_have_tcp_keepalives_unless_the_dsn_sets_them(
    postgres_dsn: str, settings: Settings, options: str, expected: list[tuple[int, ...]]
) -> None:
    # A connection a NAT or firewall dropped without a word would hang the relay for hours.
    port = int(str(conninfo_to_dict(postgres_dsn)["port"]))
    assert _keepalives_to(port) == []  # the test's own connections are closed
    with relay_in_thread(OutboxRelay(settings, postgres_dsn + options)) as relay:
        assert relay.active.wait(60), "the relay never became active"
        assert _keepalives_to(port) == expected


def test_an_autocommit_connection_writes_in_a_transaction_only(postgres_dsn: str) -> None:
    # Outside connection.transaction() each statement commits on its own: the job would exist
    # whatever became of the service's other writes.
    connection, _ = connect(postgres_dsn)
    create_table(connection)
    connection.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as connection:
        with pytest.raises(ConfigurationError, match="autocommit"):
            APP.outbox(connection).enqueue("email.send", {"to": "a@b.c"})
        with pytest.raises(ConfigurationError, match="autocommit"):
            APP.outbox(connection).enqueue_many("email.send", [{"to": "a@b.c"}])
        assert pending(postgres_dsn) == 0
        with connection.transaction() as transaction:
            APP.outbox(connection).enqueue("email.send", {"to": "a@b.c"})
            raise psycopg.Rollback(transaction)  # the service's own failure: the job goes too
        assert pending(postgres_dsn) == 0
        with connection.transaction():
            APP.outbox(connection).enqueue("email.send", {"to": "a@b.c"})
        assert pending(postgres_dsn) == 1


def test_a_relay_publishes_from_a_database_encoded_sql_ascii(
    postgres: PostgresServer, settings: Settings
) -> None:
    # Its text columns read as bytes: every row looked malformed ("topic is BLOB") and waited.
    # And a row whose text is not UTF-8 (written by other means) made every read fail whole.
    name = f"t{uuid.uuid4().hex[:12]}"
    _execute(postgres.dsn, f"CREATE DATABASE {name} ENCODING 'SQL_ASCII' TEMPLATE template0")
    dsn = postgres.dsn.rsplit("/", 1)[0] + f"/{name}"
    connection, _ = connect(dsn)
    create_table(connection)
    Pipeline(settings).outbox(connection).enqueue_many("email.send", [{"n": n} for n in range(3)])
    connection.execute(
        "INSERT INTO pipeline_outbox (topic, key, value, job_id, created_at_ms) "
        "VALUES (E'jobs\\351', NULL, '\\x01', 'by-hand', 0)"
    )
    connection.commit()
    connection.close()

    apply_topics(settings)
    with relay_in_thread(OutboxRelay(settings, dsn)) as relay:
        assert relay.active.wait(60), "the relay never became active"
        assert wait_for(lambda: pending(dsn) == 1, 60), "the rows before it were held"
        assert relay.relayed == 3  # the row written by hand waits, named in the log
