"""``pipeline exporter``: the backlog metrics that must exist when no worker runs.

A small read-only process (as Burrow or kafka-lag-exporter are): every ``--interval`` seconds it
reads the namespace's backlog from Kafka (:mod:`pipeline._backlog`) and serves the last read on
``/metrics``, with the health of that read. A scrape never waits for Kafka.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Protocol

import click
from confluent_kafka import KafkaException
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from pipeline._backlog import BacklogReader, DeadLetterCounter
from pipeline._backlogmodel import Backlog
from pipeline._cliargs import not_empty
from pipeline._deadletters import INDEX_STEP, DlqStats, LetterIndex
from pipeline._errors import KafkaUnavailableError, PipelineError
from pipeline._logfmt import configure_logging
from pipeline._metricsserver import MetricsServer, add_process_metrics

from ._output import INTERVAL_MAX_S, REQUEST_MAX_S, Seconds, cli_errors, common_options

if TYPE_CHECKING:
    from pipeline import Settings

_log = logging.getLogger("pipeline.exporter")

DEFAULT_PORT = 9103


_SUPPRESSED = re.compile(r",? \d+ identical error\(s\) suppressed")
"""What librdkafka adds to an error it repeats (inside the parentheses of its detail)."""


class BacklogSource(Protocol):
    """What the exporter reads from: a :class:`BacklogReader`, or a fake in tests."""

    def read(self) -> Backlog: ...


class ExporterState:
    """The last backlog read and how the reads went; the read loop writes, scrapes read."""

    def __init__(self) -> None:
        self.read: tuple[Backlog, bool] | None = None
        """The last backlog read, and whether its dead-letter counts are whole: not while the
        index of ``<ns>.dlq`` has not read it to its end yet (its counts so far are left out).
        One attribute, so that a scrape never pairs one read's counts with another's flag."""
        self.ok = False
        self.duration_s = 0.0
        self.errors = 0
        self.last_success = 0.0
        self.last_error = ""
        self.letters_indexed = 0
        self.last_turn = 0.0
        """When the last read ended, failed or not (the clock's time): the read loop turns."""


class BacklogCollector(Collector):
    """Turns an :class:`ExporterState` into metric families at scrape time."""

    def __init__(self, state: ExporterState, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._now = clock

    def collect(self) -> Iterator[Metric]:
        state = self._state
        backlog, whole = state.read if state.read is not None else (None, False)
        depth = GaugeMetricFamily(
            "pipeline_queue_depth",
            "Jobs on a priority topic not committed by the workers' group (end offsets minus "
            "the group's commits), waiting or running.",
            labels=["priority"],
        )
        age = GaugeMetricFamily(
            "pipeline_queue_oldest_job_age_seconds",
            "Age of the oldest job of a priority topic not committed by the workers (0: none).",
            labels=["priority"],
        )
        retries = GaugeMetricFamily(
            "pipeline_retry_depth",
            "Failed jobs waiting in a retry tier for their next attempt.",
            labels=["topic"],
        )
        deferred = GaugeMetricFamily(
            "pipeline_deferred_depth",
            "Delayed jobs on <ns>.deferred or a wait tier not committed by the scheduler "
            "leader (the jobs it holds in memory count until released).",
            labels=["topic"],
        )
        members = GaugeMetricFamily(
            "pipeline_group_members",
            "Members of the workers' and the schedulers' consumer groups.",
            labels=["role", "group"],
        )
        dead = GaugeMetricFamily(
            "pipeline_dead_letters_pending",
            "Dead letters retained on <ns>.dlq that were neither replayed nor discarded.",
        )
        retained = GaugeMetricFamily(
            "pipeline_dead_letters_retained",
            "Dead letters retained on <ns>.dlq, by what was done to them.",
            labels=["status"],
        )
        if backlog is not None:
            # After a failed read, the last successful one's ages, as its depths: a job running
            # then must not look older at every scrape while the exporter cannot read.
            now = self._now() if state.ok else backlog.read_at
            for priority, topic in backlog.jobs.items():
                depth.add_metric([priority], topic.waiting)
                oldest = topic.oldest_ms
                age.add_metric([priority], 0.0 if oldest is None else max(0.0, now - oldest / 1e3))
            for topic in backlog.retries:
                retries.add_metric([topic.topic], topic.waiting)
            for topic in backlog.deferred:
                deferred.add_metric([topic.topic], topic.waiting)
            for role, group in backlog.groups.items():
                members.add_metric([role, group.group], len(group.members))
            if whole:
                dead.add_metric([], backlog.dead_letters_pending)
                for status, count in backlog.dead_letters.by_status.items():
                    retained.add_metric([status], count)
        yield from (depth, age, retries, deferred, members, dead, retained)
        yield GaugeMetricFamily(
            "pipeline_exporter_dead_letters_indexed",
            "Dead letters the exporter's index of <ns>.dlq has read (its first reads go in "
            "steps; the dead-letter series are left out until it reached the end).",
            value=state.letters_indexed,
        )
        yield GaugeMetricFamily(
            "pipeline_exporter_read_success",
            "1 when the exporter's last read of the backlog from Kafka succeeded.",
            value=1.0 if state.ok else 0.0,
        )
        yield GaugeMetricFamily(
            "pipeline_exporter_read_duration_seconds",
            "How long the last read of the backlog took.",
            value=state.duration_s,
        )
        yield GaugeMetricFamily(
            "pipeline_exporter_last_success_timestamp_seconds",
            "When the last successful read of the backlog ended (0: never).",
            value=state.last_success,
        )
        yield CounterMetricFamily(
            "pipeline_exporter_read_errors",
            "Reads of the backlog that failed (Kafka unreachable, topics missing).",
            value=state.errors,
        )


def make_registry(
    state: ExporterState, clock: Callable[[], float] = time.time
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BacklogCollector(state, clock))
    return add_process_metrics(registry)


class Exporter:
    """Reads the backlog every ``interval`` seconds until :meth:`stop`; serves it on ``port``."""

    def __init__(
        self,
        settings: Settings,
        *,
        port: int,
        interval: float = 15.0,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._started = clock()
        self.interval = interval
        self.timeout = timeout
        self.state = ExporterState()
        self.registry = make_registry(self.state, clock)
        self._port = port
        self.port: int | None = None
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def health(self) -> tuple[bool, str]:
        """Unhealthy once no read succeeded for three intervals plus the read timeout (counted
        from the start while none has)."""
        state = self.state
        if state.ok:
            return True, "ok"
        limit = 3 * self.interval + self.timeout
        since = max(state.last_success, self._started)
        return (self._clock() - since <= limit, f"last read failed: {state.last_error}")

    def live(self) -> tuple[bool, str]:
        """``/livez``: whether the read loop turns, a read having ended (or the process started)
        within three intervals and three read timeouts. A failed read is a turn: a restart
        does not bring Kafka back (``/healthz`` says whether the reads work)."""
        limit = 3 * (self.interval + self.timeout)
        idle = self._clock() - max(self.state.last_turn, self._started)
        if idle <= limit:
            return True, "ok"
        return False, f"no read of the backlog ended for {idle:.0f}s (limit {limit:g}s)"

    def read_once(self, reader: BacklogSource, letters: LetterIndex | None = None) -> None:
        """Read the backlog once. With ``letters`` (the index that ``reader`` counts the dead
        letters from), a read succeeds while the index still catches up with a deep
        ``<ns>.dlq``: the rest of the backlog is served, the dead-letter counts only once
        whole."""
        state = self.state
        started = time.monotonic()
        try:
            backlog = reader.read()
        except (PipelineError, KafkaException) as exc:
            if self._failed(str(exc)):
                _log.warning("reading the backlog failed", extra={"error": str(exc)})
        except Exception as exc:  # a bug must not end the process that the alerts rely on
            if self._failed(f"{type(exc).__name__}: {exc}"):
                _log.exception("reading the backlog failed")
        else:
            if state.errors and not state.ok:
                _log.info("reading the backlog works again")
            if letters is not None:
                state.letters_indexed = len(letters)
            state.read = (backlog, letters is None or letters.caught_up)
            state.ok = True
            state.last_success = self._clock()
        state.duration_s = time.monotonic() - started
        state.last_turn = self._clock()

    def _failed(self, error: str) -> bool:
        """Record a failed read; whether it is worth a log line (the first of its kind in a
        row: an outage logs once, not at every interval)."""
        state = self.state
        # librdkafka appends ", N identical error(s) suppressed" to a repeated error: the same
        # outage, not a new line.
        error = _SUPPRESSED.sub("", error)
        new = state.ok or state.errors == 0 or error != state.last_error
        state.ok = False
        state.errors += 1
        state.last_error = error
        return new

    def run(self) -> int:
        server = MetricsServer(self.registry, self.health, self._port, live=self.live)
        self.port = server.port
        _log.info("serving /metrics, /healthz and /livez", extra={"port": server.port})
        try:
            with (
                LetterIndex(self.settings, timeout=self.timeout) as letters,
                BacklogReader(
                    self.settings, timeout=self.timeout, dead_letters=indexed(letters)
                ) as reader,
            ):
                while not self._stop.is_set():
                    began = time.monotonic()
                    self.read_once(reader, letters)
                    self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))
        finally:
            server.close()
        return 0


def indexed(letters: LetterIndex) -> DeadLetterCounter:
    """Dead-letter counts from ``letters``, refreshed first, in steps until it has read the
    topic to its end or half of ``timeout`` ran out (the rest of the read needs the other
    half; a first step may take it all): each interval reads only the letters and states
    written since the last, and the index keeps a summary of each letter (about 1.7 KB).
    Reading ``<ns>.dlq`` whole at every interval held every whole letter (about 7 KB): some
    70,000 retained letters outgrew the exporter's memory limit, and a topic too deep to read
    within the timeout failed every read. Until a read reaches the end, the counts are those
    of the letters read so far (:meth:`Exporter.read_once` leaves them out); the next read
    goes on from there."""

    def count(timeout: float) -> DlqStats:
        began = time.monotonic()
        deadline = began + timeout / 2
        steps = 0
        while True:
            # The first step may take the whole of the time: one that needs more than half
            # would otherwise fail every read, each starting from the same place.
            end = deadline if steps else began + timeout
            try:
                letters.refresh(max(0.1, end - time.monotonic()), limit=INDEX_STEP)
            except KafkaUnavailableError:
                if not steps:
                    raise
                # A step that had less time than the ones before it needed: Kafka answers,
                # and the next read goes on from there.
                return letters.stats()
            steps += 1
            if letters.caught_up or time.monotonic() >= deadline:
                return letters.stats()

    return count


@click.command()
@common_options
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port of /metrics, /healthz and /livez, on all interfaces (0: a free port, logged).",
)
@click.option(
    "--interval",
    type=Seconds(min=0.1, max=INTERVAL_MAX_S),
    default=15.0,
    show_default=True,
    help="Seconds between reads of the backlog from Kafka.",
)
@click.option(
    "--timeout",
    type=Seconds(min=0.5, max=REQUEST_MAX_S),
    default=10.0,
    show_default=True,
    help="Seconds one read may take before it counts as failed.",
)
@click.option(
    "--group",
    "group_id",
    default=None,
    callback=not_empty,
    help="The workers' consumer group [default: $PIPELINE_WORKER__GROUP_ID, else "
    "<namespace>.workers].",
)
def exporter(
    settings: Settings, metrics_port: int, interval: float, timeout: float, group_id: str | None
) -> None:
    """Serve the backlog as Prometheus metrics, whether or not any worker runs.

    Queue depth and oldest job age per priority, retry and deferred backlog, dead letters
    pending and group members, read from Kafka every --interval seconds. Runs until SIGTERM.
    """
    if group_id is not None:
        settings = settings.model_copy(
            update={"worker": settings.worker.model_copy(update={"group_id": group_id})}
        )
    configure_logging("INFO", settings.log_format)
    runner = Exporter(settings, port=metrics_port, interval=interval, timeout=timeout)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        runner.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with cli_errors():
        raise SystemExit(runner.run())
