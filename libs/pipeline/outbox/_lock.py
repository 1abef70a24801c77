"""One active relay per outbox table: a lock the database (or the kernel) frees with its holder.

- PostgreSQL: session-level advisory locks (``pg_try_advisory_lock``) on a connection of its
  own. The server releases them when that session ends, which a killed relay's closed socket does
  at once, and TCP keepalives within about 30 s when the host vanished (the session sets the
  server's side of them: a server's defaults wait two hours). Two keys, both taken or neither:
  the table's schema-qualified name as the server resolves it (one key whatever the spelling and
  the session's search_path), then the name as spelled, the only key of earlier versions (so
  that a relay of either version excludes one of the other).
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

from .._errors import PipelineError
from ._conninfo import Keepalives
from ._dialect import (
    POSTGRES,
    SQLITE,
    check_schema,
    connect,
    no_database,
    relay_table,
    resolved_table,
    sqlite_path,
)

__all__ = ["AdvisoryLock", "FileLock", "RelayLock", "lock_for"]

KEEPALIVES = Keepalives(idle=10, interval=5, count=4)
"""TCP keepalives of the lock's session, both ends: a peer silent for ``idle`` seconds is probed
``count`` times ``interval`` seconds apart, then the connection is dropped (30 s). The relay's
end takes the DSN's own keepalive options instead where it sets them."""
_USER_TIMEOUT_MS = 30_000
"""The same bound while data sent waits for an acknowledgement (keepalives do not probe then)."""
_USER_TIMEOUT_SINCE = 120_000
"""The first server version (``server_version_num``) that has ``tcp_user_timeout``: 12. An
older one refuses to set it (an unrecognized parameter), which kept the relay from ever taking
its lock; there the keepalives alone bound a vanished host's session."""


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
    """PostgreSQL session advisory locks, on a connection used for nothing else."""

    def __init__(self, dsn: str, table: str) -> None:
        self._dsn = dsn
        self._table = relay_table(table, POSTGRES)
        self._key = lock_key(table)
        self._connection: Any = None
        self._keys: tuple[int, ...] = ()
        """The keys held (none while not)."""

    def try_acquire(self) -> bool:
        if self._connection is None:
            self._connection = self._connect()
        try:
            keys = self._keys_to_take()
            for n, key in enumerate(keys):
                row = self._connection.execute("SELECT pg_try_advisory_lock(%s)", (key,))
                if not row.fetchone()[0]:
                    for taken in keys[:n]:  # both or neither: a standby holds none
                        self._connection.execute("SELECT pg_advisory_unlock(%s)", (taken,))
                    return False
        except Exception:
            self._drop()
            raise
        self._keys = keys
        return True

    def _keys_to_take(self) -> tuple[int, ...]:
        """The key of the resolved name, then the name's own (one key when they are the same:
        the name is schema-qualified). Every relay of this release takes the resolved one first:
        two of them never hold one key each, waiting for the other's."""
        resolved = resolved_table(self._connection, self._table)
        if resolved is None:
            raise PipelineError(  # not for good: the schema may be created yet
                f"no schema to find or create the outbox table {self._table!r} in: none of "
                "the schemas of the connection's search_path exists (create one, or set the "
                "DSN's search_path)"
            )
        return tuple(dict.fromkeys((lock_key(resolved), self._key)))

    def _connect(self) -> Any:
        """The lock's session, after the check that its table's name is the one spelling of it
        on this connection (the transactional id and progress topic are made of the name)."""
        connection, _ = connect(self._dsn, keepalives=KEEPALIVES)
        connection.autocommit = True
        try:
            check_schema(connection, self._table)
            # The server's end of the socket is the one whose death frees the lock.
            k = KEEPALIVES
            for name, value in (("idle", k.idle), ("interval", k.interval), ("count", k.count)):
                connection.execute(f"SET tcp_keepalives_{name} = {int(value)}")
            if connection.info.server_version >= _USER_TIMEOUT_SINCE:
                connection.execute(f"SET tcp_user_timeout = {_USER_TIMEOUT_MS}")
        except BaseException:
            connection.close()
            raise
        return connection

    def held(self) -> bool:
        if self._connection is None:
            return False
        try:
            # Our own session's locks: gone if the server restarted under us (a new session).
            row = self._connection.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid() AND granted "
                "AND ((classid::bigint << 32) | objid::bigint) = ANY(%s)",
                (list(self._keys),),
            ).fetchone()
        except Exception:
            self._drop()
            return False
        return bool(self._keys) and row[0] == len(self._keys)

    def release(self) -> None:
        self._drop()  # closing the session releases its advisory locks

    def _drop(self) -> None:
        connection, self._connection, self._keys = self._connection, None, ()
        if connection is not None:
            with contextlib.suppress(Exception):  # the session is gone either way
                connection.close()


class FileLock:
    """An exclusive ``flock`` on ``<database file>.<table>.relay-lock``."""

    def __init__(self, database: Path, table: str) -> None:
        self.database = database
        # Beside the file itself: a symlink to it must not make a lock of its own (two actives).
        real = database.resolve()
        self.path = real.with_name(f"{real.name}.{relay_table(table, SQLITE)}.relay-lock")
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        if not self.database.exists():  # a mistyped path: no lock file beside nothing
            raise no_database(self.database)
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
