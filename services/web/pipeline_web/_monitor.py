"""The dashboard's reading of the namespace: one background thread, pages render from it.

Every ``web.refresh_s`` the monitor runs ``before`` (the dashboard refreshes its dead-letter
index there), then reads one :class:`~pipeline._status.StatusSnapshot` (the reads ``pipeline
status`` makes, on a :class:`~pipeline._backlog.BacklogReader` kept open, with the dead letters
counted by ``dead_letters``: the index's counts instead of a read of the whole topic) and
keeps the readings of the last ``web.history_s`` seconds, so that rates in and out and the
overview's charts come from memory: a page never waits for Kafka, whatever the backlog.
A failed read is kept as :attr:`Monitor.problem` (shown on every page) until one succeeds.
A read Kafka did not answer (:class:`KafkaUnavailableError`) is also an :class:`Outage`, with
the time the first such read began: :meth:`Monitor.guarded` then fails a page's own read of
Kafka at once with :class:`KafkaDownError` ("Kafka is unreachable since ...") instead of letting
it wait out its timeout, and says "slow" of a timeout while the readings reach Kafka.
A failing ``before`` is logged, and the status is read all the same: the overview, the
backlog and ``/healthz`` do not depend on the dead-letter index.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from pipeline._backlog import BacklogReader, DeadLetterCounter
from pipeline._errors import KafkaUnavailableError, PipelineError
from pipeline._status import read_status, topic_rates

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline import Settings
    from pipeline._status import StatusSnapshot

_log = logging.getLogger("pipeline.web")
T = TypeVar("T")


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class KafkaDownError(KafkaUnavailableError):
    """A page's read of Kafka, not tried: the monitor's readings find Kafka unreachable."""


class KafkaSlowError(KafkaUnavailableError):
    """A page's read of Kafka timed out while the monitor's readings reach Kafka."""


@dataclass(frozen=True, slots=True)
class Outage:
    """Kafka did not answer the monitor's readings from ``since`` (epoch seconds: when the
    first of them began) on; ``reason``: the last one's error."""

    since: float
    reason: str

    def error(self) -> KafkaDownError:
        return KafkaDownError(f"Kafka is unreachable since {_utc(self.since)}: {self.reason}")


@dataclass(frozen=True, slots=True)
class Rate:
    """Messages per second into a topic (end offsets) and out of it (the group's commits)."""

    rate_in: float
    rate_out: float


@dataclass(frozen=True, slots=True)
class Reading:
    """One snapshot and, from the reading before it, the rates of each topic by name."""

    snapshot: StatusSnapshot
    rates: dict[str, Rate]

    @property
    def at(self) -> int:
        return self.snapshot.at


def measure(before: StatusSnapshot | None, after: StatusSnapshot) -> Reading:
    """``after`` with the rates between the two snapshots (none for a first reading)."""
    return Reading(after, {t: Rate(*r) for t, r in topic_rates(before, after).items()})


class Monitor:
    """Reads the namespace every ``refresh_s`` seconds in a daemon thread until :meth:`stop`."""

    def __init__(
        self,
        settings: Settings,
        *,
        refresh_s: float,
        history_s: float,
        timeout: float = 10.0,
        before: Callable[[float], object] | None = None,
        dead_letters: DeadLetterCounter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._refresh_s = refresh_s
        self._timeout = timeout
        self._before = before
        self._dead_letters = dead_letters
        self._clock = clock
        self._history: deque[Reading] = deque(maxlen=max(2, round(history_s / refresh_s) + 1))
        self._lock = threading.Lock()
        self._read = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeline-web-monitor", daemon=True)
        self._started = False
        self.letters_problem: str | None = None
        """Why the last refresh of the dead letters (``before``) failed; None after one that
        worked. The readings go on without it: the dead-letter counts are as of the last one."""
        self.problem: str | None = None
        """Why the last read failed (None after a successful one)."""
        self.outage: Outage | None = None
        """Set while the reads fail as Kafka does not answer them (None once one is answered)."""

    def start(self) -> None:
        """Start reading, once: later calls do nothing."""
        with self._lock:
            if self._started:
                return
            self._started = True
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._timeout + 5)

    @property
    def latest(self) -> Reading | None:
        with self._lock:
            return self._history[-1] if self._history else None

    def history(self) -> list[Reading]:
        with self._lock:
            return list(self._history)

    def wait(self, timeout: float) -> Reading | None:
        """The latest reading, waiting up to ``timeout`` seconds for a first one."""
        with self._read:
            self._read.wait_for(lambda: bool(self._history) or self.problem is not None, timeout)
            return self._history[-1] if self._history else None

    def guarded(self, read: Callable[[], T]) -> T:
        """``read()``, a page's read of Kafka, unless the readings find Kafka unreachable: then
        :class:`KafkaDownError` at once. Its :class:`KafkaUnavailableError` becomes that too
        if they found Kafka unreachable meanwhile, or :class:`KafkaSlowError` if they reach it."""
        return self._guard(read, own_words=False)

    def writing(self, write: Callable[[], T]) -> T:
        """``write()``, an action's write to Kafka, as :meth:`guarded` but that its error stands
        as raised when the readings found Kafka unreachable meanwhile: a write that failed
        part-way says how far it got, and a job sent but not acknowledged names its id."""
        return self._guard(write, own_words=True)

    def _guard(self, call: Callable[[], T], *, own_words: bool) -> T:
        if (outage := self.outage) is not None:
            raise outage.error()
        try:
            return call()
        except (KafkaDownError, KafkaSlowError):
            raise  # a guarded read within
        except KafkaUnavailableError as exc:
            if (outage := self.outage) is not None:
                if own_words:
                    raise
                raise outage.error() from exc
            if (latest := self.latest) is None or self.problem is not None:
                raise  # no word of Kafka either way
            answered = _utc(latest.at / 1000)
            raise KafkaSlowError(
                f"Kafka is slow: it answered the dashboard's last reading (at {answered}) "
                f"but not this request in time: {exc}"
            ) from exc

    def _run(self) -> None:
        reader: BacklogReader | None = None
        try:
            while not self._stopping.is_set():
                started = time.monotonic()
                self._run_before()
                reader = self._read_once(reader)
                elapsed = time.monotonic() - started
                self._stopping.wait(max(0.0, self._refresh_s - elapsed))
        finally:
            if reader is not None:
                reader.close()

    def _read_once(self, reader: BacklogReader | None) -> BacklogReader | None:
        """One reading of the status, on ``reader`` (opened if None); returns the reader."""
        began = self._clock()
        try:
            if reader is None:
                reader = BacklogReader(
                    self._settings, timeout=self._timeout, dead_letters=self._dead_letters
                )
            self._take(read_status(self._settings, timeout=self._timeout, reader=reader))
        except KafkaUnavailableError as exc:
            self._fail(str(exc), unreachable_since=began)
        except PipelineError as exc:
            self._fail(str(exc))
        except Exception as exc:  # a bug must not end the readings; it is logged
            _log.exception("reading the namespace failed")
            self._fail(f"{type(exc).__name__}: {exc}")
        return reader

    def _run_before(self) -> None:
        """Run ``before``; a failure is logged once until it changes, never fatal."""
        if self._before is None:
            return
        problem: str | None = None
        try:
            self._before(self._timeout)
        except PipelineError as exc:
            problem = str(exc)
            if problem != self.letters_problem:
                _log.warning("refreshing the dead letters failed: %s", problem)
        except Exception as exc:  # a bug must not end the readings; it is logged
            problem = f"{type(exc).__name__}: {exc}"
            _log.exception("refreshing the dead letters failed")
        self.letters_problem = problem

    def _take(self, snapshot: StatusSnapshot) -> None:
        with self._read:
            before = self._history[-1].snapshot if self._history else None
            self._history.append(measure(before, snapshot))
            if self.problem is not None:
                _log.info("reading the namespace again")
            self.problem = None
            self.outage = None
            self._read.notify_all()

    def _fail(self, problem: str, *, unreachable_since: float | None = None) -> None:
        """A failed reading; ``unreachable_since``: Kafka did not answer it, begun then."""
        with self._read:
            if problem != self.problem:
                _log.warning("reading the namespace failed: %s", problem)
            self.problem = problem
            if unreachable_since is None:
                self.outage = None  # Kafka answered (a topic missing, say): it is up
            else:
                since = unreachable_since if self.outage is None else self.outage.since
                self.outage = Outage(since, problem)
            self._read.notify_all()
