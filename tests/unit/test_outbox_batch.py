"""The relay's batches: bounded by rows, bytes and id ranges, in id order (SQLite, no broker)."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipeline._errors import ConfigurationError
from pipeline._producer import LIBRDKAFKA_MESSAGE_MAX_BYTES as MESSAGE_MAX_BYTES
from pipeline.outbox import OutboxRelay, RelayOptions
from pipeline.outbox._batch import fitting, read_batch
from pipeline.outbox._dialect import SQLITE, OutboxRow
from pipeline.outbox._progress import (
    MAX_RANGES,
    RelayProgress,
    batch_digest,
    encode_ids,
    parse_record,
)
from pipeline_cli import _outbox as outbox_cli
from pipeline_cli._main import cli

DEFAULT = RelayOptions()


@pytest.fixture
def connection(database: Path) -> Iterator[sqlite3.Connection]:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        yield connection


def _add(connection: sqlite3.Connection, rows: list[tuple[int, int]]) -> None:
    """Rows of ``(id, value size)``: ids as given (as gaps left by rolled-back inserts)."""
    with connection:
        connection.executemany(
            "INSERT INTO pipeline_outbox (id, topic, key, value, job_id, created_at_ms) "
            "VALUES (?, 't', NULL, zeroblob(?), 'job-' || ?, 0)",
            [(row_id, size, row_id) for row_id, size in rows],
        )


def _read(connection: sqlite3.Connection, max_rows: int, max_bytes: int) -> list[OutboxRow]:
    return read_batch(connection, SQLITE, "pipeline_outbox", max_rows, max_bytes)


def _delete(connection: sqlite3.Connection, batch: list[OutboxRow]) -> None:
    with connection:
        connection.executemany("DELETE FROM pipeline_outbox WHERE id = ?", [(r[0],) for r in batch])


def _record(rows: list[OutboxRow]) -> bytes:
    progress = RelayProgress.__new__(RelayProgress)  # only its value(): no Kafka client
    return progress.value(rows)


def test_a_batch_stops_at_its_byte_budget_and_the_next_goes_on_from_there(
    connection: sqlite3.Connection,
) -> None:
    # Rows close to the largest the writer takes: 5,000 of them would be 5 GB in one read.
    _add(connection, [(n, 300_000) for n in range(1, 11)])
    sizes = []
    seen: list[int] = []
    while batch := _read(connection, DEFAULT.batch_size, 1_000_000):
        sizes.append(sum(len(row[3]) for row in batch))
        seen += [row[0] for row in batch]
        _delete(connection, batch)
    assert sizes == [900_000, 900_000, 900_000, 300_000]
    assert seen == list(range(1, 11))  # every row once, in id order


def test_a_row_larger_than_the_byte_budget_is_a_batch_of_its_own(
    connection: sqlite3.Connection,
) -> None:
    # Never a batch that cannot start: the row at the head would hold up every row behind it.
    _add(connection, [(1, 2_000), (2, 500), (3, 500)])
    assert [row[0] for row in _read(connection, 100, 1_000)] == [1]
    _delete(connection, _read(connection, 100, 1_000))
    assert [row[0] for row in _read(connection, 100, 1_000)] == [2, 3]


def test_the_default_byte_budget_holds_tens_of_megabytes_not_gigabytes() -> None:
    assert 16 * 2**20 <= DEFAULT.batch_max_bytes <= 128 * 2**20
    assert DEFAULT.batch_max_bytes > MESSAGE_MAX_BYTES  # a batch of one only for a larger row


@pytest.mark.parametrize("bound", ["batch_max_bytes", "batch_size"])
def test_a_batch_bound_under_one_is_refused(bound: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{bound} must be at least 1"):
        RelayOptions(**{bound: 0})  # type: ignore[arg-type]


def test_the_relay_command_takes_a_byte_budget(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[RelayOptions] = []
    monkeypatch.setattr(OutboxRelay, "run", lambda relay, stop: started.append(relay.options))
    monkeypatch.setattr(outbox_cli, "configure_logging", lambda *args: None)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # pytest's handlers stay
    dsn = f"sqlite:///{database}"
    result = CliRunner().invoke(cli, ["outbox", "relay", "--dsn", dsn, "--batch-max-bytes", "1000"])
    assert result.exit_code == 0, result.output
    assert [options.batch_max_bytes for options in started] == [1000]
    result = CliRunner().invoke(cli, ["outbox", "relay", "--dsn", dsn, "--batch-max-bytes", "0"])
    assert result.exit_code == 2
    assert "--batch-max-bytes" in result.output


def test_a_batch_of_sparse_ids_makes_a_progress_record_kafka_takes(
    connection: sqlite3.Connection,
) -> None:
    # Every other id skipped (rolled-back inserts), ids as a long-lived sequence has them: in one
    # batch of 100,000 rows the record listed 100,000 ranges, 1.7 MB, over message.max.bytes,
    # and Kafka refused that batch for good.
    first = 10**15
    _add(connection, [(first + 2 * n, 10) for n in range(100_001)])
    batch = _read(connection, 200_000, DEFAULT.batch_max_bytes)
    record = _record(batch)
    assert len(record) < MESSAGE_MAX_BYTES // 2
    assert len(batch) == MAX_RANGES
    committed = parse_record(record.decode())
    assert committed.ids == [row[0] for row in batch]
    assert committed.ids == [first + 2 * n for n in range(MAX_RANGES)]  # the first ones


def test_the_largest_record_of_the_range_budget_is_well_under_message_max_bytes() -> None:
    # The widest ranges there are: two 19-digit ids each, as a bigint sequence ends.
    start = 2**63 - 4 * MAX_RANGES
    rows: list[OutboxRow] = [
        (start + 4 * n + k, "t", None, b"", f"{n}-{k}") for n in range(MAX_RANGES) for k in (0, 1)
    ]
    assert encode_ids([row[0] for row in rows]).count(",") == MAX_RANGES - 1
    record = _record(rows)
    assert len(record) < MESSAGE_MAX_BYTES // 2
    committed = parse_record(record.decode())  # and it reads back: the same rows
    assert committed.ids == [row[0] for row in rows]
    assert committed.digest == batch_digest((row[0], row[4]) for row in rows)


def test_contiguous_ids_are_one_range_however_many() -> None:
    sizes = [(n, 1) for n in range(1, 50_001)]
    assert fitting(sizes, 10**9, 1) == list(range(1, 50_001))


@pytest.mark.parametrize(
    ("sizes", "max_bytes", "max_ranges", "ids"),
    [
        ([], 10, 10, []),
        ([(1, 4), (2, 6), (3, 1)], 10, 10, [1, 2]),  # exactly the budget: in
        ([(1, 11), (2, 1)], 10, 10, [1]),  # over it alone: a batch of one
        ([(1, 1), (3, 1), (4, 1), (6, 1)], 100, 2, [1, 3, 4]),  # the third range waits
        ([(5, 1)], 100, 1, [5]),
    ],
)
def test_a_batch_is_the_longest_run_from_the_first_row_within_both_budgets(
    sizes: list[tuple[int, int]], max_bytes: int, max_ranges: int, ids: list[int]
) -> None:
    assert fitting(sizes, max_bytes, max_ranges) == ids
