"""One active relay per outbox table: a lock the database (or the kernel) frees with its holder.

- PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a connection of its
  own. The server releases it when that session ends, which a killed relay's closed socket does
  at once (or TCP keepalives, when the host vanished).
- SQLite: the database is a file on one host, so the lock is an ``flock`` on a file beside it
  (``<db>.<table>.relay-lock``). The kernel releases it when the holder's process exits, however
  it exits.

A standby tries the lock every ``retry_s`` and becomes active once it gets it. The lock alone
does not fence a relay that lost it while still publishing (its session ended but the process did
not notice): the Kafka transactional id does (see :mod:`._relay`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Any, Protocol

from ._dialect import connect, sqlite_path

__all__ = ["AdvisoryLock", "FileLock", "RelayLock", "lock_for"]


class RelayLock(Protocol):
    """The lock of the active relay of one outbox table."""

    def try_acquire(self) -> bool:
        """Take the lock if free; True: this process holds it now."""
        ...

    def held(self) -> bool:
        """Whether this process still holds it (False once the database session is gone)."""
        ...

    def release(self) -> None: ...


def lock_key(table: str) -> int:
    """The advisory lock key of ``table``: a stable positive 63-bit number of its name."""
    digest = hashlib.blake2b(f"pipeline-outbox-relay:{table}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class AdvisoryLock:
    """A PostgreSQL session advisory lock, on a connection used for nothing else."""

    def __init__(self, dsn: str, table: str) -> None:
        self._dsn = dsn
        self._key = lock_key(table)
        self._connection: Any = None

    def try_acquire(self) -> bool:
        if self._connection is None:
            self._connection, _ = connect(self._dsn)
            self._connection.autocommit = True
        try:
            row = self._connection.execute("SELECT pg_try_advisory_lock(%s)", (self._key,))
            got = bool(row.fetchone()[0])
        except Exception:
            self._drop()
            raise
        return got

    def held(self) -> bool:
        if self._connection is None:
            return False
        try:
            # Our own session's locks: gone if the server restarted under us (a new session).
            row = self._connection.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid() AND granted "
                "AND ((classid::bigint << 32) | objid::bigint) = %s",
                (self._key,),
            ).fetchone()
        except Exception:
            self._drop()
            return False
        return bool(row[0])

    def release(self) -> None:
        self._drop()  # closing the session releases its advisory locks

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):  # the session is gone either way
                connection.close()


class FileLock:
    """An exclusive ``flock`` on ``<database file>.<table>.relay-lock``."""

    def __init__(self, database: Path, table: str) -> None:
        self.path = database.with_name(f"{database.name}.{table}.relay-lock")
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock


def lock_for(dsn: str, table: str) -> RelayLock:
    """The relay lock of ``table`` in the database of ``dsn``."""
    path = sqlite_path(dsn)
    if path is not None:
        return FileLock(path, table)
    return AdvisoryLock(dsn, table)
