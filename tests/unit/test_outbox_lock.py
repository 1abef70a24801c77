"""The PostgreSQL relay lock's session on servers of each version (no server: a fake session).

The lock's session bounds how long a vanished relay host keeps the lock: keepalives, and
``tcp_user_timeout`` while data waits for an acknowledgement. PostgreSQL added that parameter in
version 12; an older server refused ``SET tcp_user_timeout`` ("unrecognized configuration
parameter"), so the relay never took its lock and said so every 30 s, for ever.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from pipeline.outbox import _lock as lock_module
from pipeline.outbox._dialect import POSTGRES
from pipeline.outbox._lock import AdvisoryLock


class _Session:
    """A PostgreSQL session of ``server_version``: it knows ``tcp_user_timeout`` from 12 on,
    and every advisory lock is free."""

    def __init__(self, server_version: int) -> None:
        self.info = SimpleNamespace(server_version=server_version)
        self.autocommit = False
        self.statements: list[str] = []

    def execute(self, sql: str, params: Any = None) -> Any:
        if sql.startswith("SET tcp_user_timeout") and self.info.server_version < 120_000:
            raise psycopg.errors.UndefinedObject(
                'unrecognized configuration parameter "tcp_user_timeout"'
            )
        self.statements.append(sql)
        answer = ("public",) if "current_schema" in sql else (True,)
        return SimpleNamespace(fetchone=lambda: answer)

    def close(self) -> None: ...


@pytest.mark.parametrize(
    ("version", "user_timeout"), [(100_023, False), (110_022, False), (120_000, True)]
)
def test_the_lock_is_taken_on_every_supported_server_with_the_settings_it_has(
    monkeypatch: pytest.MonkeyPatch, version: int, user_timeout: bool
) -> None:
    session = _Session(version)
    monkeypatch.setattr(lock_module, "connect", lambda dsn, keepalives: (session, POSTGRES))
    lock = AdvisoryLock("postgresql://relay@db/shop", "pipeline_outbox")
    assert lock.try_acquire()
    sets = [sql for sql in session.statements if sql.startswith("SET ")]
    assert "SET tcp_keepalives_idle = 10" in sets
    assert ("SET tcp_user_timeout = 30000" in sets) is user_timeout
