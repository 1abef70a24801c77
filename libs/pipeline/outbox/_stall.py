"""Log lines while Kafka holds up a batch: librdkafka's transactional calls block (and serve
no callbacks) while it retries, so the relay's own thread cannot say that it waits; and while
Kafka does not answer the registration of the relay's transactional id."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["StallWatch", "saying_kafka_is_away"]

_log = logging.getLogger("pipeline.outbox")
_AWAY_LOG_S = 30.0
"""How often a relay waiting for Kafka to answer its registration says so."""


class StallWatch:
    """Logs a warning when one batch has waited ``after_s`` for Kafka, then every ``every_s``."""

    def __init__(self, table: str, *, after_s: float = 10.0, every_s: float = 30.0) -> None:
        self._table = table
        self._after = after_s
        self._every = every_s
        self._lock = threading.Lock()
        self._batch: tuple[float, int, int] | None = None
        """(since, rows, first id) of the batch in Kafka's hands, None between batches."""
        self._logged = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="outbox-stall", daemon=True)
        self._thread.start()

    def begin(self, rows: int, first_id: int) -> None:
        with self._lock:
            self._batch = (time.monotonic(), rows, first_id)

    def end(self) -> None:
        with self._lock:
            self._batch = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            now = time.monotonic()
            with self._lock:
                batch = self._batch
                due = (
                    batch is not None
                    and now - batch[0] >= self._after
                    and now - self._logged >= self._every
                )
                if due:
                    self._logged = now
            if due and batch is not None:
                since, rows, first_id = batch
                _log.warning(
                    "Kafka has not taken the batch of %d rows from id %d for %.0fs; they stay in "
                    "%s and the relay keeps trying",
                    rows,
                    first_id,
                    now - since,
                    self._table,
                )


def saying_kafka_is_away(
    stop: threading.Event, servers: str, poll: Callable[[float], object]
) -> Callable[[], bool]:
    """``stop.is_set``, for :meth:`Transactions.init_until`, which calls it before each try
    to register the transactional id: from the second on, Kafka did not answer; say so at
    once, then every :data:`_AWAY_LOG_S` seconds. Each call also serves the producer's
    callbacks (``poll``), so that its health lines come while the outage lasts."""
    tries = 0
    logged = 0.0

    def stopped() -> bool:
        nonlocal tries, logged
        poll(0)
        tries += 1
        if tries > 1 and time.monotonic() - logged >= _AWAY_LOG_S:
            logged = time.monotonic()
            _log.warning(
                "Kafka at %s is unreachable: the rows wait in the table until it answers",
                servers,
            )
        return stop.is_set()

    return stopped
