"""Outbox tests: a throwaway PostgreSQL for the session, SQLite files, and relay processes.

``postgres`` starts a real PostgreSQL (``initdb`` and ``postgres`` of the machine, on a free
localhost port) the first time a test asks for it; it cannot start: the test fails, never skips.
Each test gets a database of its own (``outbox_dsn`` is parametrized over PostgreSQL and SQLite
for the tests that run on both).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from ops.pgserver import PostgresError, PostgresServer, start_postgres

from .relays import RelayLauncher

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pipeline import Settings


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    base = Path(tempfile.mkdtemp(prefix="pipeline-test-postgres-"))
    try:
        try:
            server = start_postgres(base)
        except PostgresError as exc:
            pytest.fail(f"could not start PostgreSQL for the outbox tests: {exc}", pytrace=False)
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgres_dsn(postgres: PostgresServer) -> str:
    """A new, empty database of the session's PostgreSQL."""
    import psycopg

    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return postgres.dsn.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'service.db'}"


@pytest.fixture(params=["postgresql", "sqlite"])
def outbox_dsn(request: pytest.FixtureRequest) -> str:
    """A new database of each kind in turn."""
    fixture = "postgres_dsn" if request.param == "postgresql" else "sqlite_dsn"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def relays(settings: Settings, tmp_path: Path) -> Iterator[RelayLauncher]:
    launcher = RelayLauncher(settings, tmp_path)
    try:
        yield launcher
    finally:
        launcher.stop_all()
