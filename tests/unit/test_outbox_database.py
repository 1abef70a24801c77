"""Which SQLite databases and table names the outbox accepts, and what it says about the others.

A relay derives its lock, transactional id and progress topic from its table's name, so it takes
one spelling per table only; ``status`` and ``relay`` open an existing database only, so that a
mistyped path is an error instead of an empty database. (PostgreSQL: tests/integration/outbox.)
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline import Settings
from pipeline._errors import ConfigurationError
from pipeline.outbox import OutboxRelay, RelayOptions, outbox_status
from pipeline_cli._main import cli

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
