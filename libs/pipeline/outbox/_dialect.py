"""The outbox table in each database it supports: its DDL and the few statements on it.

Plain DB-API (PEP 249): the writer takes the connection the service already has (``sqlite3`` or
``psycopg``), so the outbox row is one more statement in the service's own transaction; the relay
opens its own. Two dialects differ in the placeholder, the id column and the delete.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import ConfigurationError, PipelineError
from ._conninfo import Keepalives, refusal

__all__ = [
    "DEFAULT_TABLE",
    "POSTGRES",
    "SQLITE",
    "DatabaseUnavailableError",
    "Dialect",
    "OutboxRow",
    "check_schema",
    "connect",
    "dialect_of",
    "no_database",
    "relay_table",
    "resolved_table",
    "sql_name",
    "sqlite_path",
]

_log = logging.getLogger("pipeline.outbox")

SQLITE_BUSY_MS = 30_000
"""How long a statement waits for another connection's lock on a SQLite database."""

DEFAULT_TABLE = "pipeline_outbox"
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?").fullmatch

OutboxRow = tuple[int, str, bytes | None, bytes, str]
"""(id, topic, key, value, job_id) of one row, as the relay reads it."""


class DatabaseUnavailableError(PipelineError):
    """The outbox's database did not accept a connection (down, unreachable, refused login)."""


@dataclass(frozen=True, slots=True)
class Dialect:
    """The SQL of the outbox table in one database."""

    name: str
    placeholder: str
    id_column: str
    blob: str

    def create(self, table: str) -> str:
        return (
            f"CREATE TABLE IF NOT EXISTS {sql_name(table)} ("
            f"id {self.id_column}, topic TEXT NOT NULL, key {self.blob}, "
            f"value {self.blob} NOT NULL, job_id TEXT NOT NULL, created_at_ms BIGINT NOT NULL)"
        )

    def has_table(self, cursor: Any, table: str) -> bool:
        """Whether ``table`` exists (on PostgreSQL, found as the statements on it will be)."""
        if self.name == "postgresql":
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))
        else:
            schema, _, name = table.rpartition(".")
            cursor.execute(
                "SELECT count(*) > 0 FROM pragma_table_info(?, ?)", (name, schema or "main")
            )
        return bool(cursor.fetchone()[0])

    def insert(self, table: str) -> str:
        p = self.placeholder
        return (
            f"INSERT INTO {sql_name(table)} (topic, key, value, job_id, created_at_ms) "
            f"VALUES ({p}, {p}, {p}, {p}, {p})"
        )

    def sizes(self, table: str) -> str:
        """The id and size (value and key bytes) of the first rows, in id order: a few bytes a
        row, the values left in the database (both read a value's length from its header)."""
        return (
            f"SELECT id, length(value) + coalesce(length(key), 0) FROM {sql_name(table)} "
            f"ORDER BY id LIMIT {self.placeholder}"
        )

    def select(self, cursor: Any, table: str, ids: list[int]) -> None:
        """Select the rows ``ids`` (ascending, at least one) in id order. On SQLite, whose writers
        take turns, a row committed later has a higher id than any before it: the rows between
        the first and the last of ``ids`` are those rows. On PostgreSQL a transaction still open
        may commit an id in between: the ids are named."""
        p = self.placeholder
        columns = f"SELECT id, topic, key, value, job_id FROM {sql_name(table)}"
        if self.name == "postgresql":
            cursor.execute(f"{columns} WHERE id = ANY({p}) ORDER BY id", (ids,))
        else:
            cursor.execute(f"{columns} WHERE id BETWEEN {p} AND {p} ORDER BY id", (ids[0], ids[-1]))

    def jobs_between(self, table: str) -> str:
        """The (id, job_id) of the rows whose ids are between two bounds, in id order."""
        p, name = self.placeholder, sql_name(table)
        return f"SELECT id, job_id FROM {name} WHERE id BETWEEN {p} AND {p} ORDER BY id"

    def delete(self, cursor: Any, table: str, ids: list[int]) -> int:
        """Delete the rows ``ids``; how many there were (one statement with an array on
        PostgreSQL, a statement per row on SQLite, which runs in-process: no round trip to
        save)."""
        p, name = self.placeholder, sql_name(table)
        if self.name == "postgresql":
            cursor.execute(f"DELETE FROM {name} WHERE id = ANY({p})", (ids,))
        else:
            cursor.executemany(f"DELETE FROM {name} WHERE id = {p}", [(i,) for i in ids])
        return int(cursor.rowcount)

    def pending(self, table: str) -> str:
        return f"SELECT count(*), min(created_at_ms) FROM {sql_name(table)}"


POSTGRES = Dialect("postgresql", "%s", "BIGSERIAL PRIMARY KEY", "BYTEA")
# AUTOINCREMENT: an id is never used twice, even after the rows with the highest were deleted.
SQLITE = Dialect("sqlite", "?", "INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB")


def checked_table(table: str) -> str:
    """``table`` if it is a plain (optionally schema-qualified) SQL name; it goes into SQL text."""
    if not _TABLE_NAME(table):
        raise ConfigurationError(
            f"outbox table name {table!r} must be letters, digits and underscores "
            "(optionally schema.table)"
        )
    return table


def sql_name(table: str) -> str:
    """``table`` as it goes into SQL text: each part quoted, so that a name that is also an SQL
    keyword (``order``, ``group``) is a name; in lower case, which is where both databases find
    it unquoted (PostgreSQL folds an unquoted name to lower case; SQLite ignores the case)."""
    return ".".join(f'"{part}"' for part in checked_table(table).lower().split("."))


def dialect_of(connection: Any) -> Dialect:
    """The dialect of a DB-API connection: ``sqlite3``, or ``psycopg`` (version 3) synchronous."""
    if isinstance(connection, sqlite3.Connection):
        return SQLITE
    if type(connection).__module__.partition(".")[0] == "psycopg":
        import psycopg  # there: the connection is one of its

        if isinstance(connection, psycopg.Connection):
            return POSTGRES
        # An AsyncConnection's execute() returns a coroutine that nobody here awaits: enqueue
        # would return a job id and no row would ever be written.
        raise ConfigurationError(
            f"the outbox needs a synchronous psycopg connection, got {type(connection)!r}: "
            "pass one made by psycopg.connect(...) (from async code, run the transaction on it "
            "in a thread, e.g. asyncio.to_thread)"
        )
    raise ConfigurationError(
        f"the outbox works on a sqlite3 or psycopg (3) connection, got {type(connection)!r}"
    )


def relay_table(table: str, dialect: Dialect) -> str:
    """``table`` if it is the one spelling of its table a relay takes (its lock, transactional
    id and progress topic are made of the name: two spellings of one table would be two active
    relays): lower-case, and on SQLite without a schema (the relay's connection has ``main``
    only). PostgreSQL's schema is checked on the server: :func:`check_schema`."""
    checked_table(table)
    _, dot, name = table.rpartition(".")
    if dialect is SQLITE and dot:
        raise ConfigurationError(
            f"a SQLite outbox table is named without a schema: use {name.lower()!r}, not {table!r}"
        )
    if table != table.lower():
        raise ConfigurationError(
            f"the relay's outbox table name must be lower-case: use {table.lower()!r}, not "
            f"{table!r} (the database reads both as one table, the relay would not)"
        )
    return table


_SCHEMA_OF_PLAIN_NAME = (
    "SELECT coalesce((SELECT n.nspname FROM pg_class c JOIN pg_namespace n "
    "ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)), current_schema())"
)
"""The schema a table named without one is in (existing), or would be created in."""


def _schema_of(connection: Any, name: str) -> str | None:
    """The schema of the plain name ``name`` on PostgreSQL, as :data:`_SCHEMA_OF_PLAIN_NAME`;
    None when no schema of the session's search_path exists (nothing could be created)."""
    row = connection.execute(_SCHEMA_OF_PLAIN_NAME, (name,)).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def check_schema(connection: Any, table: str) -> None:
    """Refuse ``schema.table`` on PostgreSQL when plain ``table`` is that same table: a
    relay's table is schema-qualified only when it has to be."""
    schema, dot, name = table.rpartition(".")
    if dot and _schema_of(connection, name) == schema:
        raise ConfigurationError(
            f"{table!r} is the outbox table {name!r} of this database connection (its schema "
            f"is the one {name!r} names): use {name!r}, the one spelling relays take"
        )


def resolved_table(connection: Any, table: str) -> str | None:
    """``table`` on PostgreSQL as ``schema.table`` whatever the session's search_path: a plain
    name in the schema the search_path finds it in, or would create it in (so the same before
    and after the table is created); None when no schema of the search_path exists."""
    _, dot, name = table.rpartition(".")
    if dot:
        return table
    schema = _schema_of(connection, name)
    return None if schema is None else f"{schema}.{name}"


def sqlite_path(dsn: str) -> Path | None:
    """The database file of a ``sqlite:///path`` DSN (SQLAlchemy's form: ``sqlite:////abs``
    for an absolute path); None when ``dsn`` is not a SQLite one."""
    if not dsn.startswith("sqlite:"):
        return None
    rest = dsn.removeprefix("sqlite:")
    if not rest.startswith("///") or len(rest) == 3:
        raise ConfigurationError(
            f"a SQLite outbox DSN is sqlite:///relative/path.db or sqlite:////absolute/path.db, "
            f"got {dsn!r}"
        )
    return Path(rest[3:])


def connect(
    dsn: str, *, create: bool = True, keepalives: Keepalives | None = None, **params: Any
) -> tuple[Any, Dialect]:
    """A new connection to ``dsn`` (``postgresql://...`` or ``sqlite:///path``) and its dialect.

    ``create=False``: a SQLite database must exist already (a mistyped path is an error, not a
    new, empty database that a relay would watch for good). ``keepalives``: the TCP keepalives
    of a PostgreSQL connection, for those the DSN does not set. ``params``: libpq connection
    parameters added to a PostgreSQL DSN. A PostgreSQL DSN whose options libpq refuses is a
    :class:`ConfigurationError`; a server that does not answer, :class:`DatabaseUnavailableError`.
    """
    path = sqlite_path(dsn)
    if path is not None:
        return _open_sqlite(path, create), SQLITE
    if dsn.startswith(("postgresql://", "postgres://")) or "=" in dsn:
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError:
            raise ConfigurationError(
                "the PostgreSQL outbox needs psycopg: pip install 'kafka-pipeline[outbox]'"
            ) from None
        try:
            given = {k: str(v) for k, v in conninfo_to_dict(dsn, **params).items()}
            reason = refusal(given)  # checked here: libpq reports it as a failed connection
            if reason is not None:
                raise ConfigurationError(f"invalid PostgreSQL DSN: {_masked(reason, dsn)}")
            extra: dict[str, Any] = keepalives.params(given) if keepalives is not None else {}
            return psycopg.connect(dsn, **params, **extra), POSTGRES
        except psycopg.ProgrammingError as exc:  # libpq cannot parse it: it never will
            raise ConfigurationError(
                f"invalid PostgreSQL DSN: {_masked(str(exc), dsn)}"
            ) from None  # the cause's text may hold the password
        except psycopg.Error as exc:  # the server may come back: not a configuration error
            raise DatabaseUnavailableError(
                f"cannot connect to PostgreSQL: {_masked(str(exc), dsn)}"
            ) from exc
    scheme, colon, _ = dsn.partition(":")  # not the whole DSN: it may hold a password
    if not colon or "/" in scheme:  # a path, say: no scheme at all
        raise ConfigurationError(
            "an outbox DSN starts with its scheme: use postgresql://user@host:port/db or "
            "sqlite:///path.db (sqlite:////abs/path.db for an absolute path)"
        )
    raise ConfigurationError(
        f"unknown outbox DSN scheme {scheme!r}: use postgresql://user@host:port/db "
        "or sqlite:///path.db"
    )


def connect_to_read(dsn: str, keepalives: Keepalives) -> tuple[Any, Dialect]:
    """The relay's connection to an existing database, whose text columns always read as
    ``str``, bytes that are not UTF-8 replaced, so that a row they make unsendable is held by
    the relay's gates with an error naming it. SQLite's raised otherwise, for the whole batch,
    naming no row. PostgreSQL's are read in UTF-8, converted by the server; but a database
    encoded SQL_ASCII converts nothing (its text came as ``bytes``, and every row looked
    malformed) and refuses a whole read holding bytes that are not UTF-8: its text is read
    as it is stored."""
    connection, dialect = connect(dsn, create=False, keepalives=keepalives, client_encoding="UTF8")
    if dialect is SQLITE:
        connection.text_factory = _lenient_text
    elif connection.info.parameter_status("server_encoding") == "SQL_ASCII":
        _read_text_as_stored(connection)
    return connection, dialect


def _lenient_text(raw: bytes | memoryview) -> str:
    return bytes(raw).decode("utf-8", "replace")


def _read_text_as_stored(connection: Any) -> None:
    """No conversion by the server, and text columns decoded here, leniently."""
    from psycopg.adapt import Loader

    class LenientText(Loader):
        def load(self, data: Any) -> str:
            return _lenient_text(data)

    connection.execute("SET client_encoding TO 'SQL_ASCII'")
    connection.commit()
    for name in ("text", "varchar", "bpchar", "name"):
        connection.adapters.register_loader(name, LenientText)


_PASSWORDS = re.compile(r"://[^:/@\s]*:([^@\s]+)@|\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]+)")
"""The password of a DSN, in either form (``scheme://user:password@``, ``password=...``)."""


def _masked(text: str, dsn: str) -> str:
    """``text`` without the password of ``dsn`` (libpq quotes a DSN it cannot parse back)."""
    for match in _PASSWORDS.finditer(dsn):
        secret = match.group(1) or match.group(2)
        if secret:
            text = text.replace(secret, "***")
    return text


def no_database(path: Path) -> ConfigurationError:
    """The error of a SQLite database that should be there and is not."""
    return ConfigurationError(
        f"no SQLite database at {path}: check the DSN "
        "(pipeline outbox init creates the database and its table)"
    )


def _open_sqlite(path: Path, create: bool) -> sqlite3.Connection:
    mode = "rwc" if create else "rw"
    try:
        connection = sqlite3.connect(
            f"{path.absolute().as_uri()}?mode={mode}", uri=True, timeout=SQLITE_BUSY_MS / 1000
        )
    except sqlite3.OperationalError as exc:
        if create:
            raise ConfigurationError(
                f"cannot create SQLite database {path}: {exc} (does its directory exist, "
                "and may this user write there?)"
            ) from exc
        if not path.exists():
            raise no_database(path) from exc
        raise ConfigurationError(f"cannot open SQLite database {path}: {exc}") from exc
    try:
        if not wal_on(connection):
            _log.info("SQLite database %s in use: not switched to WAL yet", path)
    except sqlite3.DatabaseError as exc:  # the first read: a file that is no database, say
        connection.close()
        raise ConfigurationError(f"cannot open SQLite database {path}: {exc}") from exc
    return connection


def wal_on(connection: sqlite3.Connection) -> bool:
    """Whether the SQLite database of ``connection`` is in WAL mode, turning it on if it can.

    WAL: the relay's reads and deletes do not block the service's writers (nor the reverse)
    but for the moment of a commit. Turning it on takes the whole file, so it fails while
    another connection is in it: then nothing waits (the busy timeout is off for the try), the
    connection works all the same, its writes waiting for the others' as they do without WAL,
    and the relay tries again between batches. Raises ``sqlite3.DatabaseError`` for a file
    that is no database."""
    connection.execute("PRAGMA busy_timeout = 0")
    try:
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    except sqlite3.OperationalError as exc:  # locked, or (never here) inside a transaction
        _log.debug("SQLite WAL not turned on: %s", exc)
        return False
    finally:
        connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_MS}")
    return str(mode).lower() == "wal"
