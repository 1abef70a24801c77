"""Rows whose columns have types the relay cannot send (SQLite, no broker: a fake producer).

SQLite's columns take any type: a row written by other means than the outbox's writer (another
language, a SQL backfill, the ``sqlite3`` shell) may hold a TEXT value or key, or a BLOB topic.
Reading one raised a ``TypeError`` that sent the relay back to standby and in again every second,
for ever: nothing was published, not even the rows before it, and no line named the row.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline import Settings
from pipeline.outbox import OutboxRelay, RelayOptions
from pipeline.outbox import _relay as relay_module
from pipeline.outbox._batch import read_batch
from pipeline.outbox._dialect import SQLITE
from pipeline.outbox._progress import CommittedBatch, progress_topic
from tests.unit.test_transactions import FakeProducer

SETTINGS = Settings(bootstrap_servers="127.0.0.1:1", namespace="unit")
TOPIC = "unit.jobs.default"
INSERT = (
    "INSERT INTO pipeline_outbox (id, topic, key, value, job_id, created_at_ms) "
    "VALUES (?, ?, ?, ?, ?, 0)"
)
MALFORMED = [
    pytest.param((TOPIC, None, "a text value"), "value is TEXT (str), not a BLOB", id="text-value"),
    pytest.param((TOPIC, "k", b"v"), "key is TEXT (str), not a BLOB or NULL", id="text-key"),
    pytest.param((TOPIC.encode(), None, b"v"), "topic is BLOB (bytes), not TEXT", id="blob-topic"),
    pytest.param((TOPIC, 7, b"v"), "key is INTEGER (int), not a BLOB or NULL", id="int-key"),
    pytest.param((TOPIC, None, 1.5), "value is REAL (float), not a BLOB", id="real-value"),
    # bytes(5) is five zero bytes: an integer value went out as such, silently.
    pytest.param((TOPIC, None, 5), "value is INTEGER (int), not a BLOB", id="int-value"),
    pytest.param(
        (TOPIC.encode(), "k", "v"),
        "topic is BLOB (bytes), not TEXT; key is TEXT (str), not a BLOB or NULL; "
        "value is TEXT (str), not a BLOB",
        id="three-columns",
    ),
]


def _insert(database: Path, *rows: tuple[int, Any, Any, Any]) -> None:
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.executemany(INSERT, [(*row, f"job-{row[0]}") for row in rows])


def _good(*ids: int) -> list[tuple[int, Any, Any, Any]]:
    return [(i, TOPIC, b"k", b"ok%d" % i) for i in ids]


def _left(database: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return [row[0] for row in connection.execute("SELECT id FROM pipeline_outbox ORDER BY id")]


class _Producer(FakeProducer):
    """A transactional producer to a cluster that has every topic."""

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None)})


class NothingCommitted:
    """The progress topic: nothing committed yet (the relay's records go to the producer)."""

    def __init__(self, settings: Settings, table: str) -> None:
        self.topic = progress_topic(settings.namespace, table)
        self.key = table.encode()

    def ensure_topic(self, timeout: float) -> None: ...

    def value(self, rows: list[Any]) -> bytes:
        return b"progress"

    def last_committed(self, timeout: float) -> CommittedBatch:
        return CommittedBatch([], None)

    def close(self) -> None: ...


class _Relay(OutboxRelay):
    def __init__(self, database: Path) -> None:
        options = RelayOptions(retry_s=5.0, poll_interval_s=0.25, standby_retry_s=7.0)
        super().__init__(SETTINGS, f"sqlite:///{database}", options)
        self.producer = _Producer()

    def _producer(self) -> Any:
        return self.producer


class _Pauses(threading.Event):
    """The relay's stop event: records the pauses the relay takes; ``at_pause(n, timeout)``
    runs at each (n from 1) and stops the relay when it returns True."""

    def __init__(self, at_pause: Callable[[int, float | None], bool]) -> None:
        super().__init__()
        self.waits: list[float | None] = []
        self._at_pause = at_pause

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if len(self.waits) > 20 or self._at_pause(len(self.waits), timeout):
            self.set()
        return self.is_set()


@pytest.fixture(autouse=True)
def _no_progress_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "RelayProgress", NothingCommitted)


@pytest.mark.parametrize(("columns", "problems"), MALFORMED)
def test_the_rows_before_a_malformed_row_go_and_it_waits_in_order_until_fixed(
    database: Path, columns: tuple[Any, Any, Any], problems: str, caplog: pytest.LogCaptureFixture
) -> None:
    _insert(database, *_good(1, 2, 3), (4, *columns), *_good(5))
    relay = _Relay(database)
    published_before_the_fix: list[Any] = []
    left_before_the_fix: list[int] = []

    def at_pause(n: int, timeout: float | None) -> bool:
        if n == 3:  # held three reads: fix the row, as the error line says
            published_before_the_fix.extend(relay.producer.committed)
            left_before_the_fix.extend(_left(database))
            with contextlib.closing(sqlite3.connect(database)) as connection, connection:
                connection.execute(
                    "UPDATE pipeline_outbox SET topic = ?, key = NULL, value = ? WHERE id = 4",
                    (TOPIC, b"fixed"),
                )
        return timeout == 0.25  # the table is empty: stop

    stop = _Pauses(at_pause)
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"):
        relay.run(stop)
    progress = ("unit.outbox-relay.pipeline_outbox", b"progress")
    first = [(TOPIC, b"ok1"), (TOPIC, b"ok2"), (TOPIC, b"ok3"), progress]
    assert published_before_the_fix == [first], "the rows before the malformed one wait too"
    assert left_before_the_fix == [4, 5]
    assert stop.waits == [5.0, 5.0, 5.0, 0.25], "not held as a gate holds a row (retry_s)"
    assert relay.producer.calls.count("init_transactions") == 1, "the relay did not stay active"
    assert "no longer active" not in caplog.text
    assert relay.producer.committed == [first, [(TOPIC, b"fixed"), (TOPIC, b"ok5"), progress]]
    assert _left(database) == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"outbox row 4 cannot be sent as it is ({problems}): it and the rows after it wait in "
        "pipeline_outbox, in order, until the row is fixed (a BLOB value, a BLOB or NULL key, a "
        "TEXT topic; BYTEA is PostgreSQL's BLOB) or deleted"
    ], "one line per 30 s, naming the row, its columns and their types"


def test_a_deleted_malformed_row_lets_the_rows_after_it_go(database: Path) -> None:
    _insert(database, (1, TOPIC, None, "text"), *_good(2))
    relay = _Relay(database)

    def at_pause(n: int, timeout: float | None) -> bool:
        if n == 1:
            with contextlib.closing(sqlite3.connect(database)) as connection, connection:
                connection.execute("DELETE FROM pipeline_outbox WHERE id = 1")
        return timeout == 0.25

    stop = _Pauses(at_pause)
    relay.run(stop)
    assert stop.waits == [5.0, 0.25]
    assert [[m[1] for m in t] for t in relay.producer.committed] == [[b"ok2", b"progress"]]


@pytest.mark.parametrize(("columns", "problems"), MALFORMED)
def test_a_batch_ends_before_its_first_malformed_row(
    database: Path, columns: tuple[Any, Any, Any], problems: str
) -> None:
    _insert(database, *_good(1, 2), (3, *columns), *_good(4))
    with contextlib.closing(sqlite3.connect(database)) as connection:
        batch = read_batch(connection, SQLITE, "pipeline_outbox", 100, 2**20)
        assert batch == [(1, TOPIC, b"k", b"ok1", "job-1"), (2, TOPIC, b"k", b"ok2", "job-2")]
        assert batch.malformed is not None
        assert (batch.malformed.row_id, batch.malformed.problems) == (3, problems)
        connection.execute("DELETE FROM pipeline_outbox WHERE id < 3")
        connection.commit()
        batch = read_batch(connection, SQLITE, "pipeline_outbox", 100, 2**20)
        assert batch == []
        assert batch.malformed is not None
        assert batch.malformed.row_id == 3


def test_a_malformed_row_after_many_ends_its_batch_there(database: Path) -> None:
    """The rows come from the cursor a chunk at a time: the batch ends mid-chunk."""
    _insert(database, *_good(*range(1, 600)), (600, TOPIC, None, "text"), *_good(601))
    with contextlib.closing(sqlite3.connect(database)) as connection:
        batch = read_batch(connection, SQLITE, "pipeline_outbox", 1000, 2**30)
    assert [row[0] for row in batch] == list(range(1, 600))
    assert batch.malformed is not None
    assert batch.malformed.row_id == 600


def test_a_null_value_in_a_table_made_without_not_null_is_malformed(tmp_path: Path) -> None:
    """Its size was NULL, and adding it up raised a TypeError before the row was even read."""
    database = tmp_path / "loose.db"
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.execute(
            "CREATE TABLE pipeline_outbox (id INTEGER PRIMARY KEY, topic TEXT, key BLOB, "
            "value BLOB, job_id TEXT, created_at_ms BIGINT)"
        )
    _insert(database, *_good(1), (2, TOPIC, None, None))
    with contextlib.closing(sqlite3.connect(database)) as connection:
        batch = read_batch(connection, SQLITE, "pipeline_outbox", 100, 2**20)
    assert [row[0] for row in batch] == [1]
    assert batch.malformed is not None
    assert batch.malformed.problems == "value is NULL (NoneType), not a BLOB"


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_a_value_and_key_of_any_bytes_type_go_as_bytes(kind: Callable[[bytes], Any]) -> None:
    from pipeline.outbox._batch import Malformed, typed

    assert typed((1, TOPIC, kind(b"k"), kind(b"v"), "job-1")) == (1, TOPIC, b"k", b"v", "job-1")
    row = typed((1, TOPIC, None, kind(b"v"), "job-1"))
    assert row == (1, TOPIC, None, b"v", "job-1")
    assert not isinstance(row, Malformed)
    assert type(row[3]) is bytes


def test_a_topic_that_is_not_utf8_waits_in_order_naming_its_row(
    database: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # sqlite3 raised reading it, for the whole batch: nothing went, and no line named the row.
    _insert(database, *_good(1, 2))
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.execute(
            "INSERT INTO pipeline_outbox (id, topic, key, value, job_id, created_at_ms) "
            "VALUES (3, CAST(x'756e69742e6a6f6273e9' AS TEXT), NULL, x'01', 'job-3', 0)"
        )
    _insert(database, *_good(4))
    relay = _Relay(database)
    stop = _Pauses(lambda n, timeout: n == 2)
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"):
        relay.run(stop)
    progress = ("unit.outbox-relay.pipeline_outbox", b"progress")
    assert relay.producer.committed == [[(TOPIC, b"ok1"), (TOPIC, b"ok2"), progress]]
    assert _left(database) == [3, 4]
    assert stop.waits == [5.0, 5.0], "not held as a gate holds a row (retry_s)"
    assert "no longer active" not in caplog.text
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert errors[0].startswith("outbox row 3 ")
    assert "unit.jobs\ufffd" in errors[0]
