"""Which SQLite databases and table names the outbox accepts, and what it says about the others.

A relay derives its lock, transactional id and progress topic from its table's name, so it takes
one spelling per table only; ``status`` and ``relay`` open an existing database only, so that a
mistyped path is an error instead of an empty database. A PostgreSQL DSN libpq cannot parse, or
whose options it refuses, is an error too (libpq judges them with no server: they are tested
here); one whose server does not answer is waited for. (A real PostgreSQL:
tests/integration/outbox.)
"""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline import Settings
from pipeline._errors import ConfigurationError
from pipeline.outbox import OutboxRelay, RelayOptions, outbox_status
from pipeline_cli._main import cli
from tests.waiting import wait_for

SETTINGS = Settings(bootstrap_servers="127.0.0.1:1", namespace="unit")
"""Nothing listens there: these relays must stop before they try Kafka."""


def _run_briefly(relay: OutboxRelay) -> BaseException | None:
    """What ``relay.run`` raised; fails the test if it was still running after 30 s."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            relay.run(stop)
        except BaseException as exc:  # handed to the test, whatever it is
            raised.append(exc)

    stop = threading.Event()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    stop.set()
    thread.join(30)
    assert raised, "the relay kept running"
    return raised[0]


@pytest.mark.parametrize("table", ["PIPELINE_OUTBOX", "Pipeline_Outbox", "main.pipeline_outbox"])
def test_a_relay_refuses_another_spelling_of_a_table(database: Path, table: str) -> None:
    # Each spelling would have had a lock file of its own: two active relays, jobs twice.
    with pytest.raises(ConfigurationError, match="'pipeline_outbox'"):
        OutboxRelay(SETTINGS, f"sqlite:///{database}", RelayOptions(table=table))
    assert [path.name for path in database.parent.iterdir()] == [database.name]


def test_status_of_a_missing_database_names_it_and_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "sevice.db"
    with pytest.raises(ConfigurationError, match=f"no SQLite database at {typo}"):
        outbox_status(f"sqlite:///{typo}")
    result = CliRunner().invoke(cli, ["outbox", "status", "--dsn", f"sqlite:///{typo}"])
    assert result.exit_code == 2, result.output
    assert str(typo) in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_relay_of_a_missing_database_stops_and_creates_nothing(tmp_path: Path) -> None:
    typo = tmp_path / "sevice.db"
    raised = _run_briefly(OutboxRelay(SETTINGS, f"sqlite:///{typo}"))
    assert isinstance(raised, ConfigurationError), raised
    assert f"no SQLite database at {typo}" in str(raised)
    assert list(tmp_path.iterdir()) == []  # neither the database nor a lock file


def test_init_creates_a_database_but_says_when_it_cannot(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    result = CliRunner().invoke(cli, ["outbox", "init", "--dsn", f"sqlite:///{fresh}"])
    assert result.exit_code == 0, result.output
    assert outbox_status(f"sqlite:///{fresh}").pending == 0
    nowhere = tmp_path / "no-such-dir" / "x.db"
    result = CliRunner().invoke(cli, ["outbox", "init", "--dsn", f"sqlite:///{nowhere}"])
    assert result.exit_code == 2, result.output
    assert f"Error: cannot create SQLite database {nowhere}" in result.output
    assert isinstance(result.exception, SystemExit)  # a message, not a traceback


def test_init_refuses_a_bad_table_name_before_it_opens_the_database(tmp_path: Path) -> None:
    path = tmp_path / "service.db"
    args = ["outbox", "init", "--dsn", f"sqlite:///{path}", "--table", "x; drop"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert "table name 'x; drop'" in result.output
    assert not path.exists()


MALFORMED_DSNS = [
    "postgresql://app:s3cret-pw@[db.internal/shop",  # libpq quotes the whole URI back
    "postgresql://app:s3cret-pw@db.internal/shop?sslmod=require",  # an option libpq lacks
    "host=db.internal password=s3cret-pw sslmod=require",
]


@pytest.mark.parametrize("dsn", MALFORMED_DSNS)
def test_a_postgresql_dsn_libpq_cannot_parse_stops_the_relay_without_its_password(
    dsn: str,
) -> None:
    # It never connects, whatever the server does: not an outage to wait out for ever.
    raised = _run_briefly(OutboxRelay(SETTINGS, dsn))
    assert isinstance(raised, ConfigurationError), raised
    assert "PostgreSQL DSN" in str(raised)
    assert "s3cret-pw" not in str(raised)


@pytest.mark.parametrize("command", ["status", "init"])
@pytest.mark.parametrize("dsn", MALFORMED_DSNS)
def test_a_postgresql_dsn_libpq_cannot_parse_is_a_usage_error(command: str, dsn: str) -> None:
    result = CliRunner().invoke(cli, ["outbox", command, "--dsn", dsn])
    assert result.exit_code == 2, result.output
    assert "Error: invalid PostgreSQL DSN" in result.output
    assert "s3cret-pw" not in result.output


REFUSED_OPTIONS = [
    # (DSN, the option libpq refuses): each parses, and libpq refuses it only when it connects.
    ("postgresql://app:s3cret-pw@db.internal/shop?sslmode=bogus", "sslmode='bogus'"),
    ("host=db.internal password=s3cret-pw keepalives_idle=abc", "keepalives_idle='abc'"),
    ("host=db.internal password=s3cret-pw target_session_attrs=x", "target_session_attrs='x'"),
    ("postgresql://app:s3cret-pw@db.internal:abc/shop", "port='abc'"),
    ("host=db1,db2 port=5432,5433,5434 password=s3cret-pw", "port='5432,5433,5434'"),
    ("host=db.internal password=s3cret-pw connect_timeout=abc", "connect_timeout: 'abc'"),
]


@pytest.mark.parametrize(("dsn", "option"), REFUSED_OPTIONS)
def test_a_postgresql_dsn_whose_options_libpq_refuses_stops_the_relay_naming_the_option(
    dsn: str, option: str
) -> None:
    # libpq says so as a failed connection: the relay took it for an outage and waited for ever.
    raised = _run_briefly(OutboxRelay(SETTINGS, dsn))
    assert isinstance(raised, ConfigurationError), raised
    assert "invalid PostgreSQL DSN" in str(raised)
    assert option in str(raised)
    assert "s3cret-pw" not in str(raised)


@pytest.mark.parametrize(("dsn", "option"), REFUSED_OPTIONS[:2])
def test_the_relay_command_exits_2_on_a_dsn_whose_options_libpq_refuses(
    dsn: str, option: str
) -> None:
    command = [str(Path(sys.executable).parent / "pipeline"), "outbox", "relay"]
    env = {**os.environ, "PIPELINE_OUTBOX_DSN": dsn, "PIPELINE_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert f"Error: invalid PostgreSQL DSN: libpq refuses {option}" in done.stderr
    assert "s3cret-pw" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:s3cret-pw@127.0.0.1:1/shop?sslmode=disable&keepalives_idle=60",
        "host=no-such-host.invalid password=s3cret-pw",
        "host=db.internal hostaddr=127.0.0.1 port=1 password=s3cret-pw",
    ],
)
def test_a_postgresql_server_that_does_not_answer_is_waited_for(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Connection refused, no such host: the database may come back, the relay stays a standby.
    stop = threading.Event()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            OutboxRelay(SETTINGS, dsn).run(stop)
        except BaseException as exc:  # handed to the test, whatever it is
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="pipeline.outbox"):
        thread.start()
        try:
            assert wait_for(
                lambda: any("cannot take the relay lock" in r.getMessage() for r in caplog.records),
                30,
            ), raised
        finally:
            stop.set()
            thread.join(30)
    assert not thread.is_alive()
    assert raised == []
    assert "s3cret-pw" not in caplog.text


def test_a_file_that_is_no_database_is_named_by_init_status_and_the_relay(tmp_path: Path) -> None:
    # init printed a traceback, and the relay tried again every second, for ever.
    path = tmp_path / "notes.db"
    path.write_text("not a database, but a file of notes\n" * 100)
    dsn = f"sqlite:///{path}"
    for command in ("init", "status"):
        result = CliRunner().invoke(cli, ["outbox", command, "--dsn", dsn])
        assert result.exit_code == 2, result.output
        assert f"cannot open SQLite database {path}: file is not a database" in result.output
        assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    raised = _run_briefly(OutboxRelay(SETTINGS, dsn))
    assert isinstance(raised, ConfigurationError), raised
    assert f"cannot open SQLite database {path}: file is not a database" in str(raised)


def test_a_database_in_use_when_the_relay_opens_it_is_opened_without_wal(tmp_path: Path) -> None:
    """Turning WAL on takes the whole file at once, with no busy wait: a service in the middle
    of a transaction made `relay` and `status` exit 2, as for a configuration error."""
    import sqlite3

    from pipeline.outbox import create_table
    from pipeline.outbox._dialect import connect

    path = tmp_path / "shop.db"
    service = sqlite3.connect(path)  # the service's own connection: no WAL yet
    create_table(service)
    service.commit()
    service.execute(  # a write transaction left open
        "INSERT INTO pipeline_outbox (topic, key, value, job_id, created_at_ms) "
        "VALUES ('t', NULL, x'00', 'j', 0)"
    )
    try:
        relay, _ = connect(f"sqlite:///{path}", create=False)
        try:
            assert relay.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
            assert relay.execute("SELECT count(*) FROM pipeline_outbox").fetchone()[0] == 0
        finally:
            relay.close()
    finally:
        service.commit()
        service.close()
    relay, _ = connect(f"sqlite:///{path}", create=False)  # nobody else in it: WAL now
    try:
        assert relay.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert relay.execute("SELECT count(*) FROM pipeline_outbox").fetchone()[0] == 1
    finally:
        relay.close()


def test_wal_is_turned_on_once_no_other_connection_is_in_the_file(tmp_path: Path) -> None:
    """Without WAL the relay's reads make the service's commits wait: a relay that started
    while the service was in the file stayed so for as long as it ran. It tries again between
    batches (``wal_on``), without waiting for the file (a reader held the first try 30 s)."""
    import sqlite3

    from pipeline.outbox import create_table
    from pipeline.outbox._dialect import connect, wal_on

    path = tmp_path / "shop.db"
    service = sqlite3.connect(path, isolation_level=None)
    create_table(service)
    service.execute("BEGIN")
    service.execute("SELECT count(*) FROM pipeline_outbox").fetchall()  # a read under way
    relay, _ = connect(f"sqlite:///{path}", create=False)
    try:
        assert not wal_on(relay)
        assert relay.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000  # put back
        service.execute("COMMIT")  # the service leaves the file for a moment
        assert wal_on(relay)
        another = sqlite3.connect(path)  # the file's mode, whoever asks
        try:
            assert another.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            another.close()
    finally:
        relay.close()
        service.close()


def test_a_batch_larger_than_a_progress_record_reads_back_is_refused() -> None:
    """Its record would be taken, at the next relay's start, for one no relay wrote."""
    from pipeline.outbox._progress import MAX_IDS

    assert RelayOptions(batch_size=MAX_IDS).batch_size == MAX_IDS
    with pytest.raises(ConfigurationError, match="batch_size must be at most 1,000,000"):
        RelayOptions(batch_size=MAX_IDS + 1)
    result = CliRunner().invoke(
        cli, ["outbox", "relay", "--dsn", "sqlite:///x.db", "--batch-size", str(MAX_IDS + 1)]
    )
    assert result.exit_code == 2
    assert "--batch-size" in result.output


def test_a_dsn_is_checked_in_a_process_with_more_than_1024_descriptors_open() -> None:
    """libpq's refusal is read on the descriptor of a connection attempt: select() refused one
    past 1023 (``ValueError: filedescriptor out of range``), which a busy process hands out."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard == resource.RLIM_INFINITY or hard > 1100, "the test needs 1100 descriptors"
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held: list[int] = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        [(dsn, option)] = REFUSED_OPTIONS[:1]
        raised = _run_briefly(OutboxRelay(SETTINGS, dsn))
        assert isinstance(raised, ConfigurationError), raised
        assert option in str(raised)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
