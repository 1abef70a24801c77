"""A row Kafka refuses when its batch commits (SQLite, no broker: a fake producer).

The relay's gates pass what it can check itself; Kafka may still refuse a row at the commit (a
topic's ``max.message.bytes`` below the relay's ``message.max.bytes``, a write an ACL denies, a
topic deleted since it was looked up). The whole batch was then sent again for ever: nothing
was published, not even the rows before that row, and no line named it.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import KafkaUnavailableError, Settings
from pipeline._errors import TransactionAbortedError
from pipeline.outbox import OutboxRelay, RelayOptions
from pipeline.outbox import _refusalgate as refusalgate_module
from pipeline.outbox import _relay as relay_module
from pipeline.outbox._refusalgate import RefusalGate, refusal_of
from tests.unit.test_outbox_rowtypes import NothingCommitted
from tests.unit.test_transactions import FakeProducer

SETTINGS = Settings(bootstrap_servers="127.0.0.1:1", namespace="unit")
TOPIC = "unit.jobs.default"
PROGRESS = "unit.outbox-relay.pipeline_outbox"
TOO_LARGE = (
    "ProduceRequest for unit.jobs.default [0] with 3 message(s) failed: Broker: Message size "
    "too large (broker 1 PID{Id:0,Epoch:0}, base seq 0): current transaction must be aborted"
)


class _Progress(NothingCommitted):
    """The progress topic, nothing committed yet; a batch's record lists its row ids."""

    def value(self, rows: list[Any]) -> bytes:
        return ",".join(str(row[0]) for row in rows).encode()


class _Broker(FakeProducer):
    """A cluster that has every topic and aborts, at the commit, a transaction holding a value
    of ``refused`` (as Kafka does with a record larger than its topic's max.message.bytes)."""

    def __init__(self, refused: set[bytes], code: int = KafkaError.MSG_SIZE_TOO_LARGE) -> None:
        super().__init__()
        self.refused = refused
        self.code = code
        self.lookups: list[str | None] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.lookups.append(topic)
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None)})

    def commit_transaction(self, timeout: float = -1, /) -> None:
        if any(value in self.refused for _, value in self._txn):
            self.calls.append("commit refused")
            raise KafkaException(KafkaError(self.code, TOO_LARGE, txn_requires_abort=True))
        super().commit_transaction(timeout)


class _Relay(OutboxRelay):
    def __init__(self, database: Path, producer: _Broker) -> None:
        options = RelayOptions(retry_s=5.0, poll_interval_s=0.25, standby_retry_s=7.0)
        super().__init__(SETTINGS, f"sqlite:///{database}", options)
        self.producer = producer

    def _producer(self) -> Any:
        return self.producer


class _Clock:
    """The refusal gate's clock, moved on by the relay's pauses."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Pauses(threading.Event):
    """The relay's stop event: each pause moves the clock on by its length and is recorded;
    the relay stops at the first pause for an empty table, or at the ``last``."""

    def __init__(self, clock: _Clock, last: int = 20) -> None:
        super().__init__()
        self.clock = clock
        self.last = last
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.clock.now += timeout or 0.0
        if len(self.waits) >= self.last or timeout == 0.25:
            self.set()
        return self.is_set()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    monkeypatch.setattr(relay_module, "RelayProgress", _Progress)
    fake = _Clock()
    monkeypatch.setattr(refusalgate_module, "time", fake)
    return fake


def _insert(database: Path, values: list[bytes]) -> None:
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.executemany(
            "INSERT INTO pipeline_outbox (id, topic, key, value, job_id, created_at_ms) "
            "VALUES (?, ?, NULL, ?, ?, 0)",
            [(i, TOPIC, value, f"job-{i}") for i, value in enumerate(values, 1)],
        )


def _left(database: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(database)) as connection:
        return [row[0] for row in connection.execute("SELECT id FROM pipeline_outbox ORDER BY id")]


def _batches(producer: FakeProducer) -> list[list[bytes | None]]:
    return [[value for _, value in txn] for txn in producer.committed]


ROWS = [b"ok1", b"ok2", b"ok3", b"big", b"ok5", b"ok6"]


def test_the_rows_before_a_row_kafka_refuses_go_and_it_waits_named(
    database: Path, clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    _insert(database, ROWS)
    broker = _Broker({b"big"})
    stop = _Pauses(clock, last=2)
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"):
        _Relay(database, broker).run(stop)
    # Each smaller batch is a batch of its own: its transaction, its progress record (its ids),
    # its delete.
    assert _batches(broker) == [[b"ok1", b"ok2", b"ok3", b"1,2,3"]]
    assert _left(database) == [4, 5, 6]
    assert stop.waits == [5.0, 5.0], "not held as a gate holds a row (retry_s)"
    assert broker.calls.count("init_transactions") == 1, "the relay did not stay active"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"outbox row 4 is a job for {TOPIC}, which Kafka refused when its batch committed "
        f"({TOO_LARGE}): it and the rows after it wait in pipeline_outbox, in order, until "
        "Kafka takes it (it is tried again alone every 30s: check the topic's max.message.bytes "
        "and the relay's ACLs) or the row is deleted"
    ], "one line per 30 s naming the row, its topic and Kafka's reason"
    assert "publishing them again 3 at a time" in caplog.text
    assert "publishing them again 1 at a time" in caplog.text
    assert broker.lookups.count(TOPIC) > 1, "the topic of a refused batch is looked up again"


def test_a_refused_row_is_tried_alone_after_its_wait_and_the_rows_after_it_go_whole(
    database: Path, clock: _Clock
) -> None:
    _insert(database, ROWS)
    broker = _Broker({b"big"})

    class Fixed(_Pauses):
        def wait(self, timeout: float | None = None) -> bool:
            broker.refused = set()  # the topic's max.message.bytes raised, say
            return super().wait(timeout)

    stop = Fixed(clock)
    _Relay(database, broker).run(stop)
    assert _batches(broker) == [
        [b"ok1", b"ok2", b"ok3", b"1,2,3"],
        [b"big", b"4"],
        [b"ok5", b"ok6", b"5,6"],
    ]
    assert stop.waits == [5.0] * 6 + [0.25], "held 30 s, then tried alone"
    assert _left(database) == []


def test_a_deleted_refused_row_lets_the_rows_after_it_go(database: Path, clock: _Clock) -> None:
    _insert(database, ROWS)
    broker = _Broker({b"big"})

    class Deleting(_Pauses):
        def wait(self, timeout: float | None = None) -> bool:
            with contextlib.closing(sqlite3.connect(database)) as connection, connection:
                connection.execute("DELETE FROM pipeline_outbox WHERE id = 4")
            return super().wait(timeout)

    stop = Deleting(clock)
    _Relay(database, broker).run(stop)
    assert _batches(broker)[1:] == [[b"ok5", b"ok6", b"5,6"]]
    assert stop.waits == [5.0, 0.25]


def test_a_first_row_kafka_refuses_holds_every_row(database: Path, clock: _Clock) -> None:
    _insert(database, [b"big", b"ok2", b"ok3"])
    broker = _Broker({b"big"})
    _Relay(database, broker).run(_Pauses(clock, last=1))
    assert broker.committed == []
    assert _left(database) == [1, 2, 3]
    # 3 rows refused, then the first alone (1 at a time): two tries of Transactions.run
    assert broker.calls.count("commit refused") == 6


def test_an_outage_is_waited_for_not_bisected(
    database: Path, clock: _Clock, caplog: pytest.LogCaptureFixture
) -> None:
    _insert(database, ROWS)
    broker = _Broker({b"ok1"}, code=KafkaError._MSG_TIMED_OUT)
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"):
        _Relay(database, broker).run(_Pauses(clock, last=1))
    assert broker.calls.count("commit refused") == 3  # one batch, its units: no halves
    assert "Kafka did not take 6 outbox rows from id 1" in caplog.text
    assert "Kafka refused" not in caplog.text


def _aborted(code: int) -> TransactionAbortedError:
    """What ``Transactions.run`` raises after its last abort, chained as it chains it."""
    kafka = KafkaException(KafkaError(code, "why", txn_requires_abort=True))
    last = TransactionAbortedError("Kafka aborted the transaction")
    last.__cause__ = kafka
    exc = TransactionAbortedError("Kafka aborted 3 transactions in a row")
    exc.__cause__ = last
    return exc


@pytest.mark.parametrize(
    ("code", "refusal"),
    [
        (KafkaError.MSG_SIZE_TOO_LARGE, "why"),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, "why"),
        (KafkaError._MSG_TIMED_OUT, None),
        (KafkaError.REQUEST_TIMED_OUT, None),
        (KafkaError._ALL_BROKERS_DOWN, None),
    ],
)
def test_a_refusal_is_told_from_an_outage_by_kafkas_error(code: int, refusal: str | None) -> None:
    assert refusal_of(_aborted(code)) == refusal
    assert refusal_of(KafkaUnavailableError("Kafka did not answer")) is None


def test_rows_before_a_refused_row_go_first_and_a_row_gone_lets_the_rest_go() -> None:
    gate = RefusalGate("pipeline_outbox")
    rows: list[Any] = [(i, TOPIC, None, b"v", f"job-{i}") for i in (3, 4, 5, 6)]
    gate.refused(rows[1:2], "refused")
    assert gate.passable(rows) == 1  # row 3, committed late with a lower id, goes first
    assert gate.passable(rows[1:]) == 0  # row 4 waits, and so does every row after it
    assert gate.passable(rows[2:]) == 2  # row 4 is gone (deleted): whole batches again
    assert gate.passable(rows[1:]) == 3  # it is forgotten
