"""A log line while Kafka holds up a batch: librdkafka's transactional calls block (and serve
no callbacks) while it retries, so the relay's own thread cannot say that it waits."""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["StallWatch"]

_log = logging.getLogger("pipeline.outbox")


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
