"""A backlog on a real worker: every slot held by a ``gate`` job while jobs pile up behind them.

Each ``gate`` job of the suite's application opens a connection to a socket of the test and
waits until the test closes it. With as many gates running as the worker has slots, jobs
enqueued meanwhile are fetched and buffered but none can start; once the worker's metrics show
them all buffered, closing the connections frees every slot at once, and the dispatcher alone
decides which job starts next.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter
from typing import TYPE_CHECKING

from tests.integration.worker.harness import wait_until
from tests.integration.worker.harness.metrics import scrape

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.integration.worker.harness import WorkerProcess

BUFFERED = "pipeline_jobs_buffered"


class Gates:
    """The test's end of the gate jobs' connections."""

    def __init__(self) -> None:
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._held: list[socket.socket] = []

    def wait_held(self, count: int, timeout_s: float) -> None:
        """Accept ``count`` connections: that many gate jobs are running."""
        deadline = time.monotonic() + timeout_s
        while len(self._held) < count:
            self._server.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                connection, _ = self._server.accept()
            except TimeoutError:
                raise AssertionError(
                    f"only {len(self._held)} of {count} gate jobs started within {timeout_s:g}s"
                ) from None
            self._held.append(connection)

    def release(self) -> None:
        for connection in self._held:
            connection.close()
        self._held.clear()

    def close(self) -> None:
        self.release()
        self._server.close()


@contextlib.contextmanager
def held_worker(
    gates: Gates,
    slots: int,
    enqueue_gate: Callable[[], None],
    expected: Counter[str],
    *,
    metrics_port: int,
    worker: WorkerProcess,
    timeout_s: float = 30.0,
) -> Iterator[None]:
    """Hold all ``slots`` of ``worker`` with gates for the block; at its end, wait until it
    buffered at least ``expected`` jobs per priority (what the block enqueued), then let go."""
    for _ in range(slots):
        enqueue_gate()
    try:
        gates.wait_held(slots, timeout_s)
        yield

        def buffered() -> Counter[str]:
            samples = scrape(metrics_port) or {}
            return Counter(
                {
                    series.split('priority="')[1].split('"')[0]: int(value)
                    for series, value in samples.items()
                    if series.startswith(BUFFERED + "{")
                }
            )

        wait_until(
            lambda: not expected - buffered(),
            timeout=timeout_s,
            what=lambda: f"the worker to buffer {dict(expected)}; it has {dict(buffered())}",
            watch=[worker],
            interval=0.05,
        )
    finally:
        gates.release()
