"""A backlog on a real worker: every slot held by a ``gate`` job while jobs pile up behind them.

Each ``gate`` job of the suite's application opens a connection to the test's ``Gates``
(``tests/integration/worker/harness/gates.py``) and waits until the test closes it. With as many
gates running as the worker has slots, jobs enqueued meanwhile are fetched and buffered but none
can start; once the worker's metrics show them all buffered, closing the connections frees every
slot at once, and the dispatcher alone decides which job starts next.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import TYPE_CHECKING

from tests.integration.worker.harness import wait_until
from tests.integration.worker.harness.gates import Gates
from tests.integration.worker.harness.metrics import scrape

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from tests.integration.worker.harness import WorkerProcess

BUFFERED = "pipeline_jobs_buffered"


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
