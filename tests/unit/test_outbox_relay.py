"""How an active relay steps down when its Kafka producer fails for good (no broker: a fake one).

A producer that fails for good (fenced by a relay of another database that uses the same table
name and namespace, or refused its transactional id by an ACL) sends the relay back to standby.
There it waits ``standby_retry_s`` before it takes its lock and a new producer again: without the
wait, a relay that still holds the lock would register, fail and register again at once, for
ever.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import KafkaUnavailableError, Settings
from pipeline._transactions import Transactions
from pipeline.outbox import OutboxRelay, RelayOptions
from pipeline.outbox import _relay as relay_module
from tests.unit.test_outbox_rowtypes import NothingCommitted
from tests.unit.test_transactions import OutageProducer, transactions

SETTINGS = Settings(bootstrap_servers="127.0.0.1:1", namespace="unit")
"""Nothing listens there: the relay's producer is a fake."""


class _StopsOnFirstWait(threading.Event):
    """The relay's stop event: records the pauses the relay takes, and stops it at the first."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        self.set()
        return True


class _RefusedProducer:
    """A transactional producer whose registration fails for good; the third try stops the
    relay (a relay that tries again at once would otherwise never end)."""

    def __init__(self, stop: threading.Event, registrations: list[int]) -> None:
        self._stop = stop
        self._registrations = registrations

    def init_transactions(self, timeout: float = -1) -> None:
        self._registrations.append(1)
        if len(self._registrations) >= 3:
            self._stop.set()
        raise KafkaException(
            KafkaError(
                KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "Transactional Id authorization failed",
                fatal=True,
            )
        )

    def poll(self, timeout: float = -1) -> int:
        return 0

    def flush(self, timeout: float = -1) -> int:
        return 0


class _RelayOfRefusedProducers(OutboxRelay):
    def __init__(self, dsn: str, stop: threading.Event) -> None:
        super().__init__(SETTINGS, dsn, RelayOptions(standby_retry_s=7.0))
        self.registrations: list[int] = []
        self._stop = stop

    def _producer(self) -> Any:
        return _RefusedProducer(self._stop, self.registrations)


def test_a_producer_failing_for_good_is_replaced_after_a_pause_not_at_once(
    database: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stop = _StopsOnFirstWait()
    relay = _RelayOfRefusedProducers(f"sqlite:///{database}", stop)
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"):
        relay.run(stop)
    assert relay.registrations == [1], "the relay registered again without a pause"
    assert stop.waits == [7.0]
    assert caplog.text.count("back to standby") == 1
    assert not relay.active.is_set()


class _Waits(threading.Event):
    """The relay's stop event: records its pauses; Kafka answers again after the first one
    (``back``), or never, and the relay is stopped at the second (``back`` None)."""

    def __init__(self, back: Callable[[], None] | None) -> None:
        super().__init__()
        self.waits: list[float | None] = []
        self._back = back

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        if self._back is not None:
            self._back()
        elif len(self.waits) >= 2:
            self.set()
        return self.is_set()


def _unconfirmed(producer: OutageProducer) -> Transactions:
    """A transaction holding a batch whose commit Kafka did not confirm."""
    txn, _ = transactions(producer)
    txn.produce("unit.jobs.default", b"row-1")
    producer.down = frozenset({"commit_transaction"})
    with pytest.raises(KafkaUnavailableError, match="may yet be committed"):
        txn.commit()
    assert txn.committing
    return txn


@pytest.mark.parametrize("outcome", ["committed", "aborted"])
def test_a_commit_kafka_did_not_confirm_is_settled_before_the_batch_is_read_back(
    database: Path, outcome: str
) -> None:
    """Read back while that commit still went on, the batch did not show yet, and the next
    transaction (which ends that commit first) published its rows a second time."""
    producer = OutageProducer()
    txn = _unconfirmed(producer)
    producer.aborts_unconfirmed = outcome == "aborted"
    stop = _Waits(back=lambda: setattr(producer, "down", frozenset()))
    relay = OutboxRelay(SETTINGS, f"sqlite:///{database}", RelayOptions(retry_s=3.0))
    assert relay._settle(txn, stop)
    assert stop.waits == [3.0]  # asked once more after a pause, then Kafka answered
    assert not txn.committing
    expected = [[("unit.jobs.default", b"row-1")]] if outcome == "committed" else []
    assert producer.committed == expected


def test_settling_a_commit_waits_for_kafka_until_the_relay_is_stopped(database: Path) -> None:
    producer = OutageProducer()
    txn = _unconfirmed(producer)
    stop = _Waits(back=None)
    relay = OutboxRelay(SETTINGS, f"sqlite:///{database}", RelayOptions(retry_s=3.0))
    assert not relay._settle(txn, stop)
    assert stop.waits == [3.0, 3.0]
    assert txn.committing  # still unknown: nothing is read back nor written meanwhile


def test_a_table_whose_progress_topic_kafka_refuses_is_refused_at_once(database: Path) -> None:
    """The relay's own topic is ``<ns>.outbox-relay.<table>``: a name over Kafka's 249
    characters failed only once the relay was active, creating that topic, over and over."""
    from pipeline import ConfigurationError

    settings = SETTINGS.model_copy(update={"namespace": "n" * 200})
    table = "outbox_" + "t" * 50  # a name both databases take
    with pytest.raises(ConfigurationError, match=f"would be 'n+.outbox-relay.{table}'"):
        OutboxRelay(settings, f"sqlite:///{database}", RelayOptions(table=table))
    OutboxRelay(SETTINGS, f"sqlite:///{database}", RelayOptions(table=table))


def test_a_batch_is_watched_until_its_unconfirmed_commit_is_settled(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The "Kafka has not taken the batch" warnings stopped when the commit went unconfirmed,
    while the relay settled it (retries of its commit through the rest of the outage)."""
    events: list[str] = []

    class Watch:
        def __init__(self, table: str, **_: Any) -> None: ...

        def begin(self, rows: int, first_id: int) -> None:
            events.append(f"watching {rows} row(s) from {first_id}")

        def end(self) -> None:
            events.append("done watching")

        def close(self) -> None: ...

    class Producer(OutageProducer):
        def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
            return SimpleNamespace(topics={topic: SimpleNamespace(error=None)})

        def commit_transaction(self, timeout: float = -1, /) -> None:
            events.append("commit" if "commit_transaction" not in self.down else "commit lost")
            super().commit_transaction(timeout)

    producer = Producer()
    producer.down = frozenset({"commit_transaction"})
    producer.aborts_unconfirmed = True

    class Stop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if timeout == 3.0:  # the pause after the failed batch: Kafka answers again
                producer.down = frozenset()
            else:  # the table is empty: done
                self.set()
            return self.is_set()

    class Relay(OutboxRelay):
        def _producer(self) -> Any:
            return producer

    monkeypatch.setattr(relay_module, "StallWatch", Watch)
    monkeypatch.setattr(relay_module, "RelayProgress", NothingCommitted)
    with sqlite3.connect(database) as connection:
        connection.execute(
            "INSERT INTO pipeline_outbox (topic, key, value, job_id, created_at_ms) "
            "VALUES ('unit.jobs.default', NULL, x'01', 'job-1', 0)"
        )
    options = RelayOptions(retry_s=3.0, poll_interval_s=0.25)
    Relay(SETTINGS, f"sqlite:///{database}", options).run(Stop())
    # The commit is tried a few times (each lost), then settled (aborted) while still
    # watched; then the row goes again, in a batch of its own.
    lost = events.count("commit lost")
    assert lost >= 1
    assert events == [
        *["watching 1 row(s) from 1", *["commit lost"] * lost, "commit", "done watching"],
        *["watching 1 row(s) from 1", "commit", "done watching"],
    ]
    assert [[topic for topic, _ in batch] for batch in producer.committed] == [
        ["unit.jobs.default", "unit.outbox-relay.pipeline_outbox"]
    ]


class _StopsAfter(threading.Event):
    """The relay's stop event: stops it at its ``count``-th pause."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.waits = 0
        self._count = count

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits >= self._count:
            self.set()
        return self.is_set()


def test_a_relay_that_cannot_start_says_so_once_a_while_not_that_it_stopped(
    database: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table's schema missing (PostgreSQL), every try: "no longer active", once a second,
    of a relay that never was."""

    def create_table(connection: Any, table: str) -> None:
        raise sqlite3.OperationalError('schema "nosuchschema" does not exist')

    monkeypatch.setattr(relay_module, "create_table", create_table)
    stop = _StopsAfter(5)
    relay = OutboxRelay(SETTINGS, f"sqlite:///{database}", RelayOptions())
    with caplog.at_level(logging.INFO, logger="pipeline.outbox"):
        relay.run(stop)
    assert stop.waits == 5, "it tried again after each failure"
    assert caplog.text.count('cannot start publishing (schema "nosuchschema" does not') == 1
    assert "no longer active" not in caplog.text
