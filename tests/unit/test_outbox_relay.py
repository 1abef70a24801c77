"""How an active relay steps down when its Kafka producer fails for good (no broker: a fake one).

A producer that fails for good (fenced by a relay of another database that uses the same table
name and namespace, or refused its transactional id by an ACL) sends the relay back to standby.
There it waits ``standby_retry_s`` before it takes its lock and a new producer again: without the
wait, a relay that still holds the lock would register, fail and register again at once, for
ever.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from pipeline import Settings
from pipeline.outbox import OutboxRelay, RelayOptions

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
