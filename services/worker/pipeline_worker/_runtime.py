"""The composition root: the Worker runs the stages that :mod:`._assembly` wires, and their
lifecycle.

Two threads do the work. The consumer thread owns the Kafka consumer (:mod:`.intake`); the
event loop thread (the one calling :meth:`Worker.run`) decodes, dispatches and finishes jobs
(:mod:`.execute`, :mod:`.dispatch`, :mod:`.route`) and runs ``async def`` handlers; pool threads
run plain functions. Offsets and moves reach Kafka from the consumer thread (:mod:`.commit`);
poison pills and the retry relay are :mod:`.recovery`. Nothing here decides anything about a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pipeline import Pipeline, Priority, Settings
from pipeline._brokerhealth import BrokerHealth
from pipeline._errors import KafkaAuthenticationError, NotAuthorizedError, PipelineError
from pipeline._eventloop import run_loop
from pipeline._metricsserver import MetricsServer
from pipeline._topics import TopicNames, worker_group

from . import _probes, _signals
from ._assembly import assemble
from ._beats import heartbeats_of, process_client_id
from ._metrics import WorkerMetrics, per_second
from ._metricsexport import Gauges, make_registry
from ._stopping import call_hooks, close_stages, drain, stop_hooks
from ._work import PartitionState
from .execute.processor import Processor
from .intake.config import consumer_config
from .intake.consumer import ConsumerThread
from .intake.loopside import Batch
from .intake.shutdown import FINAL_COMMIT_S
from .recovery.relay import RetryRelay
from .route.dedup import Deduplicator
from .route.outcome import JobHooks, PartitionRef

if TYPE_CHECKING:
    from confluent_kafka import Message
    from prometheus_client.registry import CollectorRegistry

    from .recovery.poison import PoisonPillError

_log = logging.getLogger("pipeline.worker")

HEARTBEAT_S = 1.0
REFUSED = KafkaAuthenticationError.exit_code
EXIT_S = 5.0
"""A stop's budget beyond ``shutdown_timeout_s`` (running jobs) and ``FINAL_COMMIT_S`` (the
final commit): for what follows the commit (leaving the group, the executors, the retry relay,
the events stream, the heartbeats, the ``on_worker_stop`` hooks), which gets what is left of it
(docs/worker.md, Shutdown; :mod:`._stopping`)."""


class Worker:
    """Consumes an application's priority topics and runs its jobs until stopped.

    ``settings`` defaults to the application's; ``middleware`` hooks see every job's outcome
    and the assignment changes (see :class:`pipeline_worker.Middleware`: only its per-job
    hooks are required, the worker's lifecycle hooks are called where a middleware has them).
    The interceptors around each handler are the application's (``Pipeline(middleware=...)``).
    :meth:`run` blocks and returns the exit code; :meth:`stop` (from any thread) or
    SIGTERM/SIGINT end it gracefully.
    """

    def __init__(
        self,
        app: Pipeline,
        settings: Settings | None = None,
        *,
        middleware: Sequence[JobHooks] = (),
        child_index: int | None = None,
    ) -> None:
        self.app = app
        settings = settings if settings is not None else app.settings
        own = process_client_id(settings, child_index)
        self.settings = settings.model_copy(update={"client_id": own})
        self.middleware = tuple(middleware)
        worker = self.settings.worker
        self.group_id = worker_group(self.settings)
        self.client_id: str = consumer_config(self.settings, self.group_id)["client.id"]
        """This process's id at the group coordinator (``kafka`` options may set another)."""
        self.priorities: list[Priority] = list(worker.priorities)
        names = TopicNames(self.settings.namespace)
        self.topics = {names.jobs(p): (p, i) for i, p in enumerate(self.priorities)}
        """Topic name -> (priority, index in the priority order)."""
        self.metrics = WorkerMetrics()
        self.registry: CollectorRegistry | None = None
        self.metrics_port: int | None = None
        """The port ``/metrics`` and ``/healthz`` are served on, once running (None: off)."""
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._processor: Processor | None = None
        self._consumer: ConsumerThread | None = None
        self._dedup: Deduplicator | None = None
        self._stopped: asyncio.Event | None = None
        self._relay: RetryRelay | None = None
        self._stop_requested = threading.Event()
        self._budget: _signals.StopBudget | None = None
        """Set when the stop begins."""
        self._exit_code = 0
        self._loop_beat = time.monotonic()
        self._first_start: float | None = None
        self.health = BrokerHealth.of(self.settings.bootstrap_servers)
        """Whether this process reaches Kafka (shared by all its clients of that cluster)."""

    # -- public --------------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped; returns the exit code (0: stopped, drained; 1: failed; 4: refused).

        What the stop left behind (a job that ignored its cancellation, a thread of
        ``asyncio.to_thread`` on a call that hangs) does not hold the process
        (:mod:`pipeline._eventloop`)."""
        return run_loop(self._serve())

    def stop(self) -> None:
        """Begin a graceful stop (thread-safe): finish running jobs, commit, leave the group."""
        self._stop_requested.set()
        loop = self.loop
        if loop is not None and self._stopped is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: stopped already
                loop.call_soon_threadsafe(self._stopped.set)

    def healthy(self) -> tuple[bool, str]:
        """``/healthz``: :meth:`live`, and Kafka not unreachable for ``unhealthy_after_s``."""
        return _probes.healthy(self.live(), self.health, self.settings.worker.unhealthy_after_s)

    def live(self) -> tuple[bool, str]:
        """``/livez``: whether the consumer loop and the event loop are alive and turned
        recently, what a restart mends. Kafka unreachable is not: a worker restarted in an
        outage loses the outcomes it holds for Kafka's return (their jobs run again)."""
        consumer = self._consumer if self._stopped is not None else None
        return _probes.live(consumer, self._loop_beat, self.settings.worker.revoke_grace_s)

    @property
    def finished_jobs(self) -> int:
        return self._processor.finished if self._processor is not None else 0

    # -- lifecycle -----------------------------------------------------------------------------

    async def _serve(self) -> int:
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        if self._stop_requested.is_set() or _signals.received():
            _log.info("stopped before starting")
            return 0
        worker = self.settings.worker
        settings = self.settings
        stages = assemble(
            self.app,
            settings,
            priorities=self.priorities,
            topics={p: topic for topic, (p, _) in self.topics.items()},
            loop=self.loop,
            metrics=self.metrics,
            middleware=self.middleware,
            health=self.health,
        )
        mover, events, store = stages.mover, stages.events, stages.store
        self._dedup = stages.dedup
        self._processor = stages.processor
        processor = self._processor
        server = self._start_http(processor)
        # An application's own dedup store keeps the keys: the changelog is not written.
        own_store = self.app.dedup_store is not None
        unwritten = [TopicNames(settings.namespace).dedup] if own_store else []
        self._consumer = ConsumerThread(
            settings=self.settings,
            group_id=self.group_id,
            topics=self.topics,
            side=self,
            metrics=self.metrics,
            mover=mover,
            dedup=store,
            unwritten=unwritten,
        )
        signals = _signals.LoopSignals(
            self.loop, self.stop, self.settings.worker.shutdown_timeout_s
        )
        signals.install()
        self._call_hooks("on_worker_start", self)
        _log.info(
            "worker starting",
            extra={
                "group": self.group_id,
                "topics": ",".join(self.topics),
                "policy": worker.policy,
                "concurrency": worker.concurrency,
                "burst": worker.burst,
                "client_id": self.client_id,
            },
        )
        self._consumer.start()  # the retry relay starts once its checks passed: on_checked
        heartbeat = self.loop.create_task(self._heartbeat())
        intake = self._consumer
        beats = heartbeats_of(
            self.settings,
            self.client_id,
            self.group_id,
            processor,
            self._states,
            lambda: intake.member_id,
        )
        beating = self.loop.create_task(beats.run()) if beats is not None else None
        try:
            await self._stopped.wait()
            await self._shutdown()
        finally:
            heartbeat.cancel()
            if beating is not None:
                beating.cancel()
            # After the final commit: what is left of the budget (see _stopping).
            budget = self._budget if self._budget is not None else _signals.StopBudget(EXIT_S)
            refused = self._exit_code == REFUSED
            await close_stages(
                budget, processor, beats=beats, relay=self._relay, refused=refused,
                events=events, server=server,
            )  # fmt: skip
            signals.remove()
        await stop_hooks(budget, self.middleware, self, self.metrics)
        return self._exit_code

    async def _heartbeat(self) -> None:
        worker = self.settings.worker
        burst = worker.burst
        while True:
            self._loop_beat = time.monotonic()
            processor = self._processor
            if self._dedup is not None:
                self._dedup.expire()
            if (
                burst
                and processor is not None
                and processor.stuck
                and processor.in_progress == 0
                and not any(s.buffered for s in self._states())
            ):
                _log.error(
                    "cannot drain: outcome hooks failed for %d job(s), whose offsets stay "
                    "unfinished",
                    processor.stuck,
                )
                self._fail(1)
            down = self.health.unreachable_for()
            stopping = self._stopped is None or self._stopped.is_set()
            if burst and not stopping and down is not None and down >= worker.unhealthy_after_s:
                _log.error("burst: giving up: %s", self.health.describe())
                self._fail(1)
            await asyncio.sleep(HEARTBEAT_S)

    async def _shutdown(self) -> None:
        """Stop intake, let running jobs finish (bounded), commit, leave the group; all within
        the stop's budget."""
        processor = self._processor
        consumer = self._consumer
        assert processor is not None
        assert consumer is not None
        worker = self.settings.worker
        budget = _signals.StopBudget(worker.shutdown_timeout_s + FINAL_COMMIT_S + EXIT_S)
        self._budget = budget
        await drain(budget, processor, consumer, self._states(), worker.shutdown_timeout_s)
        self._log_summary()

    def _log_summary(self) -> None:
        processor = self._processor
        finished = processor.finished if processor is not None else 0
        extra: dict[str, object] = {"finished": finished, "exit_code": self._exit_code}
        last = processor.last_end if processor is not None else 0.0
        if self._first_start is not None and finished and last > self._first_start:
            # First batch received to last job done: the drain, without start-up and exit.
            elapsed = last - self._first_start
            extra["elapsed_s"] = round(elapsed, 3)
            extra["jobs_per_s"] = per_second(finished, elapsed)
        _log.info("worker stopped", extra=extra)

    def _fail(self, code: int) -> None:
        """End the run with ``code``; the first failure's code stands (a burst's end, 0, that
        comes after it changes nothing)."""
        if self._exit_code == 0:
            self._exit_code = code
        if self._stopped is not None:
            self._stopped.set()

    def _states(self) -> list[PartitionState]:
        consumer = self._consumer
        return list(consumer.states.values()) if consumer is not None else []

    # -- the consumer thread's calls (LoopSide) ------------------------------------------------

    def on_checked(self) -> None:
        # A worker that may not write its topics joins no group: not the retry tiers' either.
        stopping = self._stopped is None or self._stopped.is_set()
        if self.settings.worker.retries and not stopping:
            # It ends at once if the cluster has no tier (see recovery.tiers).
            self._relay = RetryRelay(self.settings, self.group_id, self.metrics, self._relay_failed)
            self._relay.start()

    def on_batch(self, batch: Batch) -> None:
        if self._first_start is None:
            self._first_start = time.monotonic()
        assert self._processor is not None
        try:
            self._processor.on_batch(batch)
        except Exception:
            # A bug, not bad input (that is skipped per message): a worker that silently lost
            # a batch would stall its partitions, so stop and let the orchestrator restart it.
            _log.critical("processing a batch failed; stopping", exc_info=True)
            self._fail(1)

    def on_poison(self, state: PartitionState, message: Message, error: PoisonPillError) -> None:
        assert self._processor is not None
        try:
            self._processor.move_poison(state, message, error)
        except Exception:
            _log.critical("dead-lettering a poison pill failed; stopping", exc_info=True)
            self._fail(1)

    def on_assigned(self, states: list[PartitionState]) -> None:
        if states:
            refs = [PartitionRef(s.topic, s.partition) for s in states]
            self._call_hooks("on_partitions_assigned", self, refs)

    def on_share(self, owned: dict[str, int], total: dict[str, int]) -> None:
        assert self._processor is not None
        self._processor.set_share(owned, total)

    async def revoke(self, states: list[PartitionState], *, lost: bool) -> None:
        processor = self._processor
        assert processor is not None
        for state in states:
            state.active = False
        dropped = processor.drop(states)
        grace = self.settings.worker.revoke_grace_s
        running = sum(s.in_flight for s in states)
        if running and not await processor.wait_idle(states, grace):
            _log.warning(
                "revoke grace period over: %d job(s) of revoked partitions still running; "
                "their offsets are not committed",
                sum(s.in_flight for s in states),
                extra={"grace_s": grace},
            )
        for state in states:
            state.released = True  # jobs still running were given up: see PartitionState
        _log.debug("revoked partitions released", extra={"dropped_buffered": dropped})
        refs = [PartitionRef(s.topic, s.partition) for s in states]
        self._call_hooks("on_partitions_revoked", self, refs, lost=lost)

    def on_burst_drained(self) -> None:
        _log.info("burst: drained, exiting")
        self._fail(0)

    def _relay_failed(self, exc: BaseException) -> None:
        """The retry relay thread failed (called on that thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: stopping already
            self.loop.call_soon_threadsafe(self.on_consumer_failed, exc)

    def on_consumer_failed(self, exc: BaseException) -> None:
        if isinstance(exc, PipelineError):  # a message that says what to do
            _log.error("stopping: %s", exc)
        else:
            _log.error("stopping: the consumer failed: %s", exc)
        refused = isinstance(exc, (KafkaAuthenticationError, NotAuthorizedError))
        self._fail(REFUSED if refused else 1)

    # -- helpers -------------------------------------------------------------------------------

    def _call_hooks(self, name: str, *args: object, **kwargs: object) -> None:
        call_hooks(self.middleware, self.metrics, name, *args, **kwargs)

    def _start_http(self, processor: Processor) -> MetricsServer | None:
        port = self.settings.worker.metrics_port
        gauges = Gauges(
            in_flight=lambda: processor.in_flight,
            concurrency=self.settings.worker.concurrency,
            threads=lambda: processor.pool.threads,
            overdue=lambda: processor.pool.overdue,
            buffered=self._buffered_by_priority,
            paused=lambda: self._consumer.paused_full if self._consumer is not None else 0,
            assigned=lambda: len(self._states()),
        )
        self.registry = make_registry(self.metrics, gauges)
        if port is None:
            return None
        server = MetricsServer(self.registry, self.healthy, port, live=self.live)
        self.metrics_port = server.port
        _log.info("serving /metrics and /healthz", extra={"port": server.port})
        return server

    def _buffered_by_priority(self) -> dict[str, int]:
        counts = {p.value: 0 for p in self.priorities}
        for state in self._states():
            counts[state.priority.value] += max(0, state.buffered)
        return counts
