"""A commit of the moves' transaction in flight on a helper thread, so that the consumer thread
polls, hands batches and resumes partitions meanwhile.

Committing a transaction takes Kafka a few round trips (the offsets to the transaction and the
group coordinator, then the end of the transaction): tens of milliseconds on a busy broker,
during which a consumer thread that made the calls itself handed the event loop nothing, and a
worker whose every job settles an idempotency key spent half its time waiting (see "Idempotency
keys in a worker" in docs/benchmarks.md). A :class:`Flight` makes the blocking calls on a thread
of its own; the thread that started it takes the outcome back (:meth:`Flight.land`) before it
touches the transaction again, so every decision about the transaction stays on that thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["Flight"]

Outcome = BaseException | None
"""What the call raised, or None once it returned."""


class Flight:
    """At most one call in flight; ``name`` names the helper thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future[tuple[Outcome, float]] | None = None
        self._then: Callable[[Outcome], None] | None = None
        self.ended_at = 0.0
        """When the call last landed ended (``time.monotonic``), for its ``then``."""

    @property
    def busy(self) -> bool:
        """Whether a call was started and its outcome not taken back yet."""
        return self._future is not None

    def start(self, call: Callable[[], object], then: Callable[[Outcome], None]) -> None:
        """Run ``call`` on the helper thread; :meth:`land` hands ``then`` what it raised."""
        if self._future is not None:
            raise RuntimeError("a call is in flight already: land it first")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=self._name)
        self._future = self._executor.submit(_outcome, call)
        self._then = then

    def land(self, *, wait: bool = True) -> bool:
        """Take back the outcome of the call in flight, if any, and run its ``then`` on this
        thread (what ``then`` raises comes out of here). Returns False only when ``wait`` is
        False and the call goes on."""
        future, then = self._future, self._then
        if future is None or then is None:
            return True
        if not wait and not future.done():
            return False
        outcome, self.ended_at = future.result()
        self._future = self._then = None
        then(outcome)
        return True

    def close(self) -> None:
        """Land what is in flight (its outcome is handled as usual), then end the thread."""
        try:
            self.land()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def _outcome(call: Callable[[], object]) -> tuple[Outcome, float]:
    try:
        call()
    except BaseException as exc:  # handed to the starting thread, which decides
        return exc, time.monotonic()
    return None, time.monotonic()
