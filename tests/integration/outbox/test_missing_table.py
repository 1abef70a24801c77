"""Writing to an outbox table that does not exist: the driver's own error (for the caller's
handlers), with a note saying how to create the table."""

from __future__ import annotations

import pytest

from pipeline import Pipeline, Settings
from pipeline.outbox import connect


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_writing_to_a_missing_table_says_how_to_create_it(outbox_dsn: str, many: bool) -> None:
    """It raised sqlite3's "no such table" or psycopg's UndefinedTable alone."""
    app = Pipeline(Settings(bootstrap_servers="127.0.0.1:1", namespace="unit"))
    connection, _ = connect(outbox_dsn)
    try:
        outbox = app.outbox(connection, table="orders_outbox")
        write = (
            (lambda: outbox.enqueue_many("noop", [{"n": 1}, {"n": 2}]))
            if many
            else (lambda: outbox.enqueue("noop", {"n": 1}))
        )
        with pytest.raises(Exception) as raised:  # noqa: PT011 - the driver's own error
            write()
        assert "orders_outbox" in str(raised.value), "not the driver's missing-table error"
        notes = getattr(raised.value, "__notes__", [])
        assert any("`pipeline outbox init --table orders_outbox`" in note for note in notes)
    finally:
        connection.rollback()
        connection.close()
        app.close(1)
