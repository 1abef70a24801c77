"""The relay's batch bounds on each database, and through a relay publishing to a real Kafka.

A batch stops at its byte budget and at its budget of id ranges (which keeps its progress record
a message Kafka takes), and is still the table's first rows in id order.
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import Pipeline, Settings
from pipeline._admin import apply_topics
from pipeline.outbox import OutboxRelay, RelayOptions, connect, create_table
from pipeline.outbox import _batch as batch_module
from pipeline.outbox._batch import read_batch
from pipeline.outbox._progress import parse_record, progress_topic
from tests.waiting import wait_for

from .relays import pending, read_topic, relay_in_thread

RELAY_TIMEOUT_S = 120.0


def _insert(connection: Any, placeholder: str, rows: list[tuple[int, bytes]]) -> None:
    p = placeholder
    cursor = connection.cursor()
    cursor.executemany(
        "INSERT INTO pipeline_outbox (id, topic, key, value, job_id, created_at_ms) "
        f"VALUES ({p}, 't', {p}, {p}, {p}, 0)",
        [(row_id, b"k", value, f"job-{row_id}") for row_id, value in rows],
    )
    connection.commit()


def test_a_batch_stops_at_either_budget_on_each_database(
    outbox_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connection, dialect = connect(outbox_dsn)
    try:
        create_table(connection)
        # 1-6 contiguous, then 10, 12, 14: ids a rolled-back insert skipped
        _insert(connection, dialect.placeholder, [(i, b"v" * 999) for i in (1, 2, 3, 4, 5, 6)])
        _insert(connection, dialect.placeholder, [(i, b"v" * 999) for i in (10, 12, 14)])

        def ids(max_bytes: int) -> list[int]:
            batch = read_batch(connection, dialect, "pipeline_outbox", 100, max_bytes)
            return [row[0] for row in batch]

        assert ids(2_500) == [1, 2]  # 1,000 bytes a row, key and value
        assert ids(10) == [1]  # a row over the budget alone: a batch of one
        monkeypatch.setattr(batch_module, "MAX_RANGES", 2)
        assert ids(10**6) == [1, 2, 3, 4, 5, 6, 10]
        monkeypatch.setattr(batch_module, "MAX_RANGES", 1)
        assert ids(10**6) == [1, 2, 3, 4, 5, 6]
        batch = read_batch(connection, dialect, "pipeline_outbox", 2, 10**6)
        assert batch == [(1, "t", b"k", b"v" * 999, "job-1"), (2, "t", b"k", b"v" * 999, "job-2")]
    finally:
        connection.close()


def test_a_relay_publishes_batches_within_both_budgets_each_job_once(
    outbox_dsn: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    apply_topics(settings)
    app = Pipeline(settings)
    connection, _ = connect(outbox_dsn)
    try:
        create_table(connection)
        outbox = app.outbox(connection)
        small = outbox.enqueue_many("noop", [{"n": n} for n in range(1, 31)])  # ids 1-30
        large = outbox.enqueue_many("noop", [{"text": "x" * 300_000}] * 8)  # ids 31-38
        connection.commit()
        cursor = connection.cursor()
        # Sparse ids, as rolled-back inserts leave them: every even id of the small rows gone.
        cursor.execute("DELETE FROM pipeline_outbox WHERE id <= 30 AND id % 2 = 0")
        connection.commit()
        cursor.close()
    finally:
        connection.close()
    monkeypatch.setattr(batch_module, "MAX_RANGES", 3)  # the relay runs in this process
    with relay_in_thread(
        OutboxRelay(settings, outbox_dsn, RelayOptions(batch_max_bytes=1_000_000))
    ):
        assert wait_for(lambda: pending(outbox_dsn) == 0, RELAY_TIMEOUT_S)
    records = read_topic(settings, progress_topic(settings.namespace, "pipeline_outbox"))
    batches = [parse_record((record.value() or b"").decode()).ids for record in records]
    odd = list(range(1, 31, 2))
    assert batches == [
        *(odd[i : i + 3] for i in range(0, 15, 3)),  # three ranges a batch
        [31, 32, 33],  # three rows of 300 KB: a fourth would pass 1,000,000 bytes
        [34, 35, 36],
        [37, 38],
    ]
    jobs = read_topic(settings, f"{settings.namespace}.jobs.default")
    published = sorted(app.codec.decode(record.value() or b"").id for record in jobs)
    assert published == sorted(small[0::2] + large)  # the rows left, each once
