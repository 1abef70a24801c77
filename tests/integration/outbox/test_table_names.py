"""An outbox table whose name is also an SQL keyword, on each database, end to end.

The name went into the SQL unquoted: creating, writing and relaying such a table were syntax
errors, and a relay of it gave up being active and tried again every second, for ever, while
its rows waited.
"""

from __future__ import annotations

import pytest

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline.outbox import OutboxRelay, RelayOptions, connect, create_table, outbox_status
from tests.waiting import wait_for

from .relays import assert_published_once, relay_in_thread

RELAY_TIMEOUT_S = 120.0


@pytest.mark.parametrize("table", ["order", "user"])
def test_a_table_named_by_a_keyword_is_relayed(
    outbox_dsn: str, settings: Settings, table: str
) -> None:
    apply_topics(settings)
    app = Pipeline(settings)
    connection, _ = connect(outbox_dsn)
    try:
        create_table(connection, table)
        job_ids = app.outbox(connection, table=table).enqueue_many("noop", [{"n": 1}] * 5)
        connection.commit()
    finally:
        connection.close()
    assert outbox_status(outbox_dsn, table).pending == 5
    relay = OutboxRelay(settings, outbox_dsn, RelayOptions(table=table))
    with relay_in_thread(relay):
        assert wait_for(lambda: outbox_status(outbox_dsn, table).pending == 0, RELAY_TIMEOUT_S)
    assert_published_once(settings, job_ids)
