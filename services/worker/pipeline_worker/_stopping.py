"""A graceful stop, within its budget (docs/worker.md, Shutdown); and the middleware's
lifecycle hooks, called safely.

Intake stops, the running jobs get ``shutdown_timeout_s`` to end, the consumer commits and
leaves the group (:func:`drain`). After that final commit, the stages close side by side (the
executors, the heartbeats, the retry relay, the events stream, the metrics server), then the
``on_worker_stop`` hooks run. They are user code, so each runs on a daemon thread of its own,
one after the other in the middleware's order, and is awaited for at most what is left of the
budget: one that hangs (a flush to an unreachable collector) is named in the log and left
behind, as any other step, and the worker exits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._signals import StopBudget

if TYPE_CHECKING:
    from pipeline._metricsserver import MetricsServer

    from ._beats import Heartbeats
    from ._metrics import WorkerMetrics
    from ._work import PartitionState
    from .execute.processor import Processor
    from .intake.consumer import ConsumerThread
    from .recovery.relay import RetryRelay
    from .route.events import EventStream

_log = logging.getLogger("pipeline.worker")

UNREACHABLE_CLOSE_S = 5.0
"""How long the consumer's close is waited for while Kafka is unreachable."""

RELAY_STOP_S = 10.0
"""The retry relay's own wait for its thread (and last commit) at most."""


async def drain(
    budget: StopBudget,
    processor: Processor,
    consumer: ConsumerThread,
    states: Sequence[PartitionState],
    timeout_s: float,
) -> None:
    """Stop intake, let running jobs finish (for ``timeout_s`` at most), commit, leave the
    group; all within ``budget``."""
    processor.stopping = True
    consumer.intake_stopped = True
    dropped = processor.drop(states)
    running = processor.in_progress
    _log.info(
        "stopping: intake stopped",
        extra={"running": running, "dropped_buffered": dropped},
    )
    if running and not await processor.wait_idle((), timeout_s):
        _log.warning(
            "shutdown timeout: abandoning %d running job(s); their offsets are not "
            "committed, so they will run again",
            processor.in_progress,
            extra={"timeout_s": timeout_s},
        )
    consumer.stop_requested = True
    # The final commit (bounded by FINAL_COMMIT_S) comes first, then leaving the group. With
    # Kafka unreachable there is neither to make (Kafka expires the member), and librdkafka's
    # close waits for the coordinator all the same: it took the whole budget, past the grace
    # period an orchestrator gives (30 s by Kubernetes' default), which then killed it.
    unreachable = consumer.health.down
    await budget.wait(
        "the consumer (final commit, leaving the group)",
        _closed(consumer),
        at_most=UNREACHABLE_CLOSE_S if unreachable else None,
    )


async def _closed(consumer: ConsumerThread) -> None:
    while not consumer.done.is_set():
        await asyncio.sleep(0.01)


async def close_stages(
    budget: StopBudget,
    processor: Processor,
    *,
    beats: Heartbeats | None,
    relay: RetryRelay | None,
    refused: bool,
    events: EventStream | None,
    server: MetricsServer | None,
) -> None:
    """Close what runs beside the consumer, side by side, so that one that hangs neither keeps
    the process up nor starves the others. The executors close here: a job that ignores its
    cancellation is left behind. ``refused``: Kafka refused the worker, so the relay has
    nothing to commit and is not waited for."""
    steps = [budget.wait("the executors", processor.close())]
    if beats is not None:
        steps.append(budget.call("the heartbeats", beats.close))
    if relay is not None:
        relay_s = 0.5 if refused else min(RELAY_STOP_S, budget.left())
        steps.append(budget.call("the retry relay", functools.partial(relay.stop, relay_s)))
    if events is not None:
        steps.append(
            budget.call("the events stream", functools.partial(events.close, budget.left()))
        )
    if server is not None:
        steps.append(budget.call("the metrics server", server.close))
    await asyncio.gather(*steps)


def call_hooks(
    middleware: Sequence[object], metrics: WorkerMetrics, name: str, *args: Any, **kwargs: Any
) -> None:
    """Call the hook ``name`` of each middleware that has one; one that raises is logged and
    counted, never fatal."""
    for item in middleware:
        hook = getattr(item, name, None)
        if hook is None:
            continue
        try:
            hook(*args, **kwargs)
        except Exception:
            metrics.hook_failures += 1
            _log.exception("%s.%s failed", type(item).__name__, name)


async def stop_hooks(
    budget: StopBudget, middleware: Sequence[object], worker: object, metrics: WorkerMetrics
) -> None:
    """Run each middleware's ``on_worker_stop(worker)``, in order, each on a thread of its own
    (:meth:`StopBudget.call`) and awaited for at most what is left of ``budget`` (see the
    module docstring); one whose turn comes once the budget is spent is not started, so that
    the hooks never run side by side."""
    for item in middleware:
        if getattr(item, "on_worker_stop", None) is not None:
            name = f"{type(item).__name__}.on_worker_stop"
            if budget.spent(name):
                continue
            await budget.call(
                name, functools.partial(call_hooks, (item,), metrics, "on_worker_stop", worker)
            )
