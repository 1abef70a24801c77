"""The outbox's writing side, table, lock and CLI errors, on real SQLite files (no broker)."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pipeline import Pipeline, Settings
from pipeline._codec import JobCodec
from pipeline._errors import ConfigurationError, PayloadValidationError
from pipeline.outbox import connect, create_table, outbox_status
from pipeline.outbox._batch import read_batch
from pipeline.outbox._dialect import SQLITE, dialect_of, sqlite_path
from pipeline.outbox._lock import FileLock, lock_key
from pipeline.outbox._progress import (
    CommittedBatch,
    RelayProgress,
    decode_ids,
    encode_ids,
    parse_record,
)
from pipeline.outbox._relay import OutboxRelay
from pipeline_cli._main import cli

NAMESPACE = "unit"


@pytest.fixture
def app() -> Pipeline:
    app = Pipeline(Settings(bootstrap_servers="127.0.0.1:1", namespace=NAMESPACE))

    @app.job("typed")
    def typed(count: int) -> None: ...

    @app.job("typed_text")
    def typed_text(text: str) -> None: ...

    return app


def rows(path: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as connection:
        return connection.execute(
            "SELECT id, topic, key, value, job_id FROM pipeline_outbox ORDER BY id"
        ).fetchall()


def test_a_committed_row_holds_what_enqueue_would_send(app: Pipeline, database: Path) -> None:
    connection = sqlite3.connect(database)
    connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    connection.execute("INSERT INTO orders VALUES (1)")
    job_id = app.outbox(connection).enqueue("email.send", {"to": "a@b.c"}, priority="high")
    assert rows(database) == []  # not committed yet: nobody else sees it
    connection.commit()
    [(_, topic, key, value, stored_id)] = rows(database)
    assert (topic, stored_id) == (f"{NAMESPACE}.jobs.high", job_id)
    job = JobCodec().decode(value)
    assert (job.id, job.type, json.loads(job.payload)) == (job_id, "email.send", {"to": "a@b.c"})
    # Without a key of its own a job gets the outbox's, as idempotency and partition key.
    assert job.idempotency_key == f"outbox:{job_id}"
    assert key == job.idempotency_key.encode()


def test_a_rolled_back_transaction_leaves_no_job(app: Pipeline, database: Path) -> None:
    connection = sqlite3.connect(database)
    app.outbox(connection).enqueue("email.send", {"to": "a@b.c"})
    connection.rollback()
    assert rows(database) == []


def test_keys_given_are_kept(app: Pipeline, database: Path) -> None:
    connection = sqlite3.connect(database)
    outbox = app.outbox(connection)
    keyed = outbox.enqueue("email.send", {}, key="customer-7")
    unique = outbox.enqueue("email.send", {}, idempotency_key="order-9", key="customer-7")
    connection.commit()
    (_, _, key1, value1, _), (_, _, key2, value2, _) = rows(database)
    # An explicit key stays the partition key (its jobs keep their order).
    assert (key1, JobCodec().decode(value1).idempotency_key) == (b"customer-7", f"outbox:{keyed}")
    assert (key2, JobCodec().decode(value2).idempotency_key) == (b"order-9", "order-9")
    assert unique != keyed


def test_a_delayed_job_goes_to_the_deferred_topic(app: Pipeline, database: Path) -> None:
    connection = sqlite3.connect(database)
    app.outbox(connection).enqueue("email.send", {}, delay=60)
    connection.commit()
    [(_, topic, _, value, _)] = rows(database)
    assert topic == f"{NAMESPACE}.deferred"
    assert JobCodec().decode(value).not_before is not None


def test_an_invalid_payload_raises_and_adds_no_row(app: Pipeline, database: Path) -> None:
    connection = sqlite3.connect(database)
    with pytest.raises(PayloadValidationError):
        app.outbox(connection).enqueue("typed", {"count": "many"})
    connection.commit()
    assert rows(database) == []


def test_rows_are_in_the_order_they_were_written(app: Pipeline, database: Path) -> None:
    connection = sqlite3.connect(database)
    outbox = app.outbox(connection)
    ids = [outbox.enqueue("typed", {"count": n}) for n in range(50)]
    connection.commit()
    assert [row[4] for row in rows(database)] == ids


def test_unsupported_connections_and_bad_names_are_refused(app: Pipeline, database: Path) -> None:
    with pytest.raises(ConfigurationError, match="sqlite3 or psycopg"):
        app.outbox(object())
    with pytest.raises(ConfigurationError, match="table name"):
        app.outbox(sqlite3.connect(database), table="jobs; DROP TABLE orders")
    assert dialect_of(sqlite3.connect(database)).name == "sqlite"


@pytest.mark.parametrize(
    ("dsn", "path"),
    [
        ("sqlite:///relative/app.db", Path("relative/app.db")),
        ("sqlite:////var/lib/app.db", Path("/var/lib/app.db")),
        ("postgresql://u@h/db", None),
    ],
)
def test_sqlite_dsns(dsn: str, path: Path | None) -> None:
    assert sqlite_path(dsn) == path


def test_a_malformed_sqlite_dsn_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="sqlite:///"):
        sqlite_path("sqlite://app.db")


def test_one_file_lock_holder_at_a_time(database: Path) -> None:
    first, second = FileLock(database, "pipeline_outbox"), FileLock(database, "pipeline_outbox")
    other_table = FileLock(database, "other_outbox")
    assert first.try_acquire()
    assert first.held()
    assert not second.try_acquire()
    assert other_table.try_acquire()
    first.release()
    assert not first.held()
    assert second.try_acquire()


def test_a_symlink_to_the_database_takes_the_same_lock(database: Path, tmp_path: Path) -> None:
    # The lock file was named after the path as given: a relay started with a symlink to the
    # database had a lock of its own, and both relays were active.
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "shop.db"
    link.symlink_to(database)
    direct, linked = FileLock(database, "pipeline_outbox"), FileLock(link, "pipeline_outbox")
    assert direct.try_acquire()
    try:
        assert not linked.try_acquire()
    finally:
        direct.release()
    assert linked.try_acquire()
    linked.release()


def test_advisory_lock_keys_are_stable_and_positive() -> None:
    assert lock_key("pipeline_outbox") == lock_key("pipeline_outbox")
    assert lock_key("pipeline_outbox") != lock_key("other")
    assert 0 < lock_key("pipeline_outbox") < 2**63


def test_status_counts_the_waiting_rows(app: Pipeline, database: Path) -> None:
    assert outbox_status(f"sqlite:///{database}").pending == 0
    connection = sqlite3.connect(database)
    app.outbox(connection).enqueue("typed", {"count": 1})
    connection.commit()
    status = outbox_status(f"sqlite:///{database}")
    assert status.pending == 1
    assert status.oldest_age_s is not None
    assert status.oldest_age_s >= 0


def test_cli_status_and_init(database: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["outbox", "status", "--dsn", f"sqlite:///{database}"])
    assert result.exit_code == 0, result.output
    assert "pipeline_outbox" in result.output
    fresh = tmp_path / "fresh.db"
    result = CliRunner().invoke(cli, ["outbox", "init", "--dsn", f"sqlite:///{fresh}"])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(cli, ["outbox", "status", "--dsn", f"sqlite:///{fresh}", "--json"])
    assert json.loads(result.output)["pending"] == 0


@pytest.mark.parametrize(
    "args",
    [
        ["outbox", "status", "--dsn", "mysql://user:secret@host/db"],
        ["outbox", "init", "--dsn", "sqlite://nowhere"],
        ["outbox", "status", "--dsn", "sqlite:///x.db", "--table", "a b"],
        ["outbox", "relay"],
    ],
)
def test_cli_usage_errors_exit_2(args: list[str]) -> None:
    result = CliRunner(env={"PIPELINE_OUTBOX_DSN": None}).invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "Error" in result.output
    assert "secret" not in result.output


def test_cli_status_of_a_missing_table_fails(database: Path) -> None:
    args = ["outbox", "status", "--dsn", f"sqlite:///{database}", "--table", "nothing_here"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert "cannot read outbox table nothing_here" in result.output


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([], ""),
        ([5], "5"),
        ([1, 2, 3, 7, 9, 10], "1-3,7,9-10"),
        (list(range(100, 1100)), "100-1099"),
    ],
)
def test_batch_ids_travel_as_ranges(ids: list[int], text: str) -> None:
    assert encode_ids(ids) == text
    assert decode_ids(text) == ids


def test_bad_id_ranges_are_refused() -> None:
    with pytest.raises(ValueError, match="range"):
        decode_ids("9-3")
    with pytest.raises(ValueError, match="more than"):  # would take all memory, expanded
        decode_ids("1-99999999999")


def test_enqueue_many_adds_a_row_per_payload_in_order(app: Pipeline, database: Path) -> None:
    connection = sqlite3.connect(database)
    outbox = app.outbox(connection)
    ids = outbox.enqueue_many("typed", ({"count": n} for n in range(20)), priority="low")
    with pytest.raises(
        PayloadValidationError, match=r"job #1 of the batch \(0 of the 1 before"
    ) as e:
        outbox.enqueue_many("typed", [{"count": 1}, {"count": "x"}])
    # Which payload it was, and that nothing of the batch went in (as the message says).
    assert (e.value.index, e.value.enqueued_ids) == (1, [])
    connection.commit()
    found = rows(database)
    assert [row[4] for row in found] == ids
    assert {row[1] for row in found} == {f"{NAMESPACE}.jobs.low"}
    assert [json.loads(JobCodec().decode(row[3]).payload)["count"] for row in found] == list(
        range(20)
    )


def test_enqueue_many_refuses_one_idempotency_key_for_every_row(
    app: Pipeline, database: Path
) -> None:
    """Every row carried the key: the workers ran the first job and dropped the rest."""
    connection = sqlite3.connect(database)
    outbox = app.outbox(connection)
    with pytest.raises(ConfigurationError, match="one idempotency key for every job"):
        outbox.enqueue_many("typed", [{"count": 1}, {"count": 2}], idempotency_key="batch-7")
    connection.commit()
    assert rows(database) == []


class _LastBatch:
    """What the progress topic holds: the record of one committed batch."""

    topic = "ns.outbox-relay.pipeline_outbox"

    def __init__(self, record: bytes) -> None:
        self.record = record

    def ensure_topic(self, timeout: float) -> None: ...

    def last_committed(self, timeout: float) -> CommittedBatch:
        return parse_record(self.record.decode())


def _recover(app: Pipeline, database: Path, record: bytes) -> None:
    relay = OutboxRelay(app.settings, f"sqlite:///{database}")
    with contextlib.closing(sqlite3.connect(database)) as connection:
        done = relay._recover(connection, SQLITE, _LastBatch(record), threading.Event())  # type: ignore[arg-type]
    assert done


def _record_of(database: Path, ids: list[int]) -> bytes:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        fetched = read_batch(connection, SQLITE, "pipeline_outbox", 100, 2**20)
    progress = RelayProgress.__new__(RelayProgress)  # only its value(): no Kafka client
    return progress.value([row for row in fetched if row[0] in ids])


def test_a_relay_taking_over_deletes_the_rows_of_the_last_committed_batch(
    app: Pipeline, database: Path
) -> None:
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        app.outbox(connection).enqueue_many("typed", ({"count": n} for n in range(5)))
    _recover(app, database, _record_of(database, [1, 2, 3]))
    assert [row[0] for row in rows(database)] == [4, 5]


def test_rows_that_only_share_the_ids_of_the_last_committed_batch_are_kept(
    app: Pipeline, database: Path, tmp_path: Path
) -> None:
    # Another database (or this one, restored from a backup) committed a batch with ids 1-3:
    # the rows under those ids here hold other jobs, never published.
    other = tmp_path / "other.db"
    for path in (database, other):
        with contextlib.closing(sqlite3.connect(path)) as connection, connection:
            create_table(connection)
            app.outbox(connection).enqueue_many("typed", ({"count": n} for n in range(5)))
    _recover(app, database, _record_of(other, [1, 2, 3]))
    assert [row[0] for row in rows(database)] == [1, 2, 3, 4, 5]


def test_a_progress_record_another_writer_left_is_reported_and_passed_over(
    app: Pipeline, database: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """It restarted the relay every second, for ever, and it published nothing."""
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        app.outbox(connection).enqueue_many("typed", ({"count": n} for n in range(3)))
    with caplog.at_level(logging.ERROR, logger="pipeline.outbox"):
        _recover(app, database, b"outbox-relay/2:1-x;digest")
    assert "is not one a relay wrote" in caplog.text
    assert len(rows(database)) == 3  # nothing deleted: those rows go out again


def test_a_record_of_the_first_format_still_deletes_its_ids(app: Pipeline, database: Path) -> None:
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        app.outbox(connection).enqueue_many("typed", ({"count": n} for n in range(5)))
    _recover(app, database, b"outbox-relay/1:1-2")
    assert [row[0] for row in rows(database)] == [3, 4, 5]


def test_a_job_larger_than_kafka_takes_is_refused_and_adds_no_row(
    app: Pipeline, database: Path
) -> None:
    # Written, it would stay at the head of the table for good: every row behind it would wait.
    big = "x" * 1_000_000
    with contextlib.closing(sqlite3.connect(database)) as connection:
        outbox = app.outbox(connection)
        with pytest.raises(PayloadValidationError, match=r"message\.max\.bytes"):
            outbox.enqueue("typed_text", {"text": big})
        with pytest.raises(PayloadValidationError, match=r"message\.max\.bytes"):
            outbox.enqueue_many("typed_text", [{"text": "small"}, {"text": big}])
        outbox.enqueue("typed_text", {"text": "x" * 900_000})  # under the limit
        connection.commit()
    assert len(rows(database)) == 1
    allowing = Pipeline(
        Settings(
            bootstrap_servers="127.0.0.1:1",
            namespace=NAMESPACE,
            kafka={"message.max.bytes": "2000000"},
        )
    )
    with contextlib.closing(sqlite3.connect(database)) as connection:
        allowing.outbox(connection).enqueue("typed_text", {"text": big})
        connection.commit()
    assert len(rows(database)) == 2


def test_a_job_too_large_for_its_idempotency_key_alone_asks_for_a_shorter_key(
    app: Pipeline, database: Path
) -> None:
    # As app.enqueue says: the message carries the key twice; the payload is not the problem.
    key = "k" * 500_100
    with contextlib.closing(sqlite3.connect(database)) as connection:
        outbox = app.outbox(connection)
        with pytest.raises(ConfigurationError, match="pass a shorter key"):
            outbox.enqueue("typed_text", {"text": "small"}, idempotency_key=key)
        with pytest.raises(ConfigurationError, match="pass a shorter key"):
            app.enqueue("typed_text", {"text": "small"}, idempotency_key=key)
    assert rows(database) == []


def test_an_autocommit_connection_outside_a_transaction_is_refused(
    app: Pipeline, database: Path
) -> None:
    # Each statement would commit on its own: the order of place_order (examples/) without its
    # job if the process died in between, or the job of an order rolled back after it.
    connection = sqlite3.connect(database, isolation_level=None)
    connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    connection.execute("INSERT INTO orders VALUES (1)")  # committed already
    with pytest.raises(ConfigurationError, match="autocommit"):
        app.outbox(connection).enqueue("email.send", {"to": "a@b.c"})
    with pytest.raises(ConfigurationError, match="autocommit"):
        app.outbox(connection).enqueue_many("email.send", [{"to": "a@b.c"}])
    assert rows(database) == []
    # In a transaction it opened itself, the job commits (or rolls back) with it.
    connection.execute("BEGIN")
    app.outbox(connection).enqueue("email.send", {"to": "a@b.c"})
    connection.execute("ROLLBACK")
    assert rows(database) == []
    connection.execute("BEGIN")
    job_id = app.outbox(connection).enqueue("email.send", {"to": "a@b.c"})
    connection.execute("COMMIT")
    assert [row[4] for row in rows(database)] == [job_id]


@pytest.mark.parametrize("table", ["order", "group", "select", "Order", "main.order"])
def test_a_table_named_by_an_sql_keyword_is_written_read_and_deleted(
    app: Pipeline, tmp_path: Path, table: str
) -> None:
    # The name went into the SQL unquoted: every statement on such a table was a syntax error,
    # and a relay of it gave up being active and tried again each second, for ever.
    path = tmp_path / "service.db"
    connection = sqlite3.connect(path)
    create_table(connection, table)
    job_ids = app.outbox(connection, table=table).enqueue_many("typed", [{"count": 1}] * 3)
    connection.commit()
    plain = table.rpartition(".")[2].lower()
    assert outbox_status(f"sqlite:///{path}", table).pending == 3
    batch = read_batch(connection, SQLITE, plain, 10, 2**20)
    assert [row[4] for row in batch] == job_ids
    cursor = connection.cursor()
    assert SQLITE.delete(cursor, plain, [row[0] for row in batch]) == 3
    connection.commit()
    assert outbox_status(f"sqlite:///{path}", plain).pending == 0


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        ("/var/lib/shop/shop.db", "an outbox DSN starts with its scheme"),
        ("shop.db", "an outbox DSN starts with its scheme"),
        ("mysql://app:secret@db/shop", "unknown outbox DSN scheme 'mysql'"),
    ],
)
def test_a_dsn_without_a_known_scheme_says_which_to_use(dsn: str, says: str) -> None:
    """A path was called an unknown scheme ("unknown outbox DSN scheme '/var/lib/...'")."""
    with pytest.raises(ConfigurationError) as raised:
        connect(dsn)
    assert says in str(raised.value)
    assert "sqlite:///path.db" in str(raised.value)
    assert "secret" not in str(raised.value)
