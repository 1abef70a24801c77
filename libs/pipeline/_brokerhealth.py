"""Whether this process reaches Kafka: one tracker per cluster, fed by every client's callbacks.

librdkafka reports an outage as a stream: each reconnect attempt (every 50 ms to 10 s, per
client) logs a line and raises an error callback, which made thousands of lines a minute and
said nothing a probe could use. Every client of a process instead hands its callbacks to the
:class:`BrokerHealth` of its cluster (:meth:`BrokerHealth.of`), which logs one line when Kafka
becomes unreachable and one when it is back, keeps librdkafka's own lines at DEBUG (or, for
lines that are not about connections, once a minute per kind), and answers
:meth:`~BrokerHealth.unreachable_for` for ``/healthz`` and ``--burst``.

The evidence, and why it is enough:

* *Unreachable*: a client's ``_ALL_BROKERS_DOWN`` error: it lost or never had a connection to
  any broker. The cause named is the last connection error before it (``Connection refused``,
  a name that does not resolve, a TLS failure). Or statistics in which no broker has sent this
  client anything for ``SILENT_S``: a frozen broker or a network that drops packets breaks no
  connection, and librdkafka reports nothing down. Where clients with statistics watch the
  cluster (the worker's consumer, the scheduler's leadership consumer), only theirs count: an
  error of a client that is polled now and then may be served long after the outage ended.
* *Reachable*: a client's statistics (``stats=True``, once a second, for clients that are
  polled continuously) that show a broker ``UP`` heard from within ``SILENT_S``, or the
  delivery of a message produced during the outage. A client that saw the outage itself
  proves the end of it as soon as it reports a broker up; another client's word counts only
  ``GRACE_S`` after the outage began, since its statistics may have been taken before the
  connections broke.

A client Kafka *refuses* (bad credentials, a TLS certificate it does not trust:
:func:`~pipeline._authfailure.is_refusal`) is not an outage: the tracker keeps the cause in
:attr:`BrokerHealth.refusal`, tells the client's ``on_refused`` (the producer raises it) and
logs nothing but DEBUG lines, however often librdkafka repeats it; the worker and the scheduler
read :attr:`~BrokerHealth.refusal` and exit with one line. A broker a client reports ``UP``
(which it is only once authenticated) clears it.

A forked child starts every tracker afresh (:func:`_after_fork`): the parent's clients, whose
evidence they hold, are not the child's, and a lock a parent's thread held at the fork would
stay held in the child for good.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar

from confluent_kafka import KafkaError, Message

from ._authfailure import is_refusal
from ._clientlog import split_log_call
from ._ratelog import RateLimitedLog

_log = logging.getLogger("pipeline.kafka")

STATS_INTERVAL_MS = 1000
GRACE_S = 2.5 * STATS_INTERVAL_MS / 1000
"""How long after an outage began a client that did not see it may prove it is over."""
SILENT_S = 20.0
"""How long the brokers of a client with statistics may stay silent (no byte received from any,
``rxidle``) before Kafka counts as unreachable, its connections open or not."""
REPEAT_S = 60.0
"""librdkafka lines of one kind (numbers aside) that are not about connections: one per minute."""

# Error codes that say "no connection", as opposed to "Kafka said no".
_CONNECTION_CODES = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE, KafkaError._TIMED_OUT})
# librdkafka log facilities of connection attempts, failures and request timeouts, and of the
# transactional id's registration, which it retries by itself while a coordinator (re)loads.
_CONNECTION_FACILITIES = frozenset({"FAIL", "BROKERFAIL", "ERROR", "REQTMOUT", "CONNECT", "GETPID"})
_AFTER = re.compile(r" \(after \d+ms in state [A-Z_]+(, \d+ identical error\(s\) suppressed)?\)$")
_NUMBER = re.compile(r"\d+")

ErrorCallback = Callable[[KafkaError], None]
RefusedCallback = Callable[[str], None]
DeliveryCallback = Callable[[KafkaError | None, Message], None]


class BrokerHealth:
    """Reachability of the Kafka cluster at ``servers``, as this process's clients see it."""

    _trackers: ClassVar[dict[str, BrokerHealth]] = {}
    _trackers_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, servers: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.servers = servers
        self._clock = clock
        self._start_afresh()
        _every_tracker.add(self)

    def _start_afresh(self) -> None:
        """What the tracker knows, as a new one (its own locks included)."""
        self._lock = threading.Lock()
        self._since: float | None = None
        self._since_wall = 0.0
        self._cause = ""
        self._cause_specific = False
        self._saw_outage: set[str] = set()
        self._watchers: set[str] = set()
        """Clients with statistics: polled all the time, so their errors are current."""
        self._last_problem: dict[str, str] = {}
        self._lines = RateLimitedLog(_log, interval_s=REPEAT_S)
        self.down = False
        """Whether Kafka is unreachable now (a plain read, for hot paths)."""
        self.refusal: str | None = None
        """librdkafka's text of the first refusal of a client of this process (credentials,
        TLS), until a broker accepts one; None: none refused."""

    @classmethod
    def of(cls, servers: str) -> BrokerHealth:
        """The process's tracker for the cluster at ``servers``: all its clients share one, so
        that an outage is one line however many clients see it."""
        with cls._trackers_lock:
            tracker = cls._trackers.get(servers)
            if tracker is None:
                tracker = cls._trackers[servers] = cls(servers)
            return tracker

    # -- what the services ask ----------------------------------------------------------------

    def unreachable_for(self) -> float | None:
        """Seconds since Kafka became unreachable, or None while it is reachable."""
        with self._lock:
            return None if self._since is None else max(0.0, self._clock() - self._since)

    @property
    def cause(self) -> str:
        """The last connection error of the current outage ('' while reachable)."""
        return self._cause

    def describe(self) -> str:
        """``Kafka at X unreachable for N s: cause`` (or that it is reachable), for probes."""
        down = self.unreachable_for()
        if down is None:
            return f"Kafka at {self.servers} is reachable"
        return f"Kafka at {self.servers} unreachable for {down:.0f}s: {self._cause}"

    # -- librdkafka options -------------------------------------------------------------------

    def callbacks(
        self,
        source: str,
        *,
        on_error: ErrorCallback | None = None,
        on_refused: RefusedCallback | None = None,
        stats: bool = False,
    ) -> dict[str, Any]:
        """librdkafka options that feed this tracker from client ``source``.

        Connection errors and refusals are the tracker's (a refusal is also handed to
        ``on_refused``, each time); other errors go to ``on_error`` (else they are logged,
        rate-limited). ``stats``: statistics once a second, for a client polled at least that
        often (they queue up in one that is not).
        """
        conf: dict[str, Any] = {
            "error_cb": lambda error: self.on_error(source, error, on_error, on_refused),
            "logger": _TrackerLog(self, source, on_refused),
        }
        if stats:
            conf["stats_cb"] = lambda text: self.on_stats(source, text)
            conf["statistics.interval.ms"] = STATS_INTERVAL_MS
            with self._lock:
                self._watchers.add(source)
        return conf

    def watch_delivery(self, source: str, on_delivery: DeliveryCallback) -> DeliveryCallback:
        """``on_delivery``, also telling the tracker that Kafka took the message; for messages
        produced while it is unreachable (their acknowledgement comes from after the outage)."""

        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is None:
                self.reachable(source)
            on_delivery(error, message)

        return delivered

    # -- evidence -----------------------------------------------------------------------------

    def on_error(
        self,
        source: str,
        error: KafkaError,
        then: ErrorCallback | None = None,
        on_refused: RefusedCallback | None = None,
    ) -> None:
        code = error.code()
        if is_refusal(code, error.str()):
            self.refused(source, error.str(), on_refused)
        elif code == KafkaError._ALL_BROKERS_DOWN:
            self.unreachable(source, self._problem(source) or error.str())
        elif code in _CONNECTION_CODES:
            self._note_problem(source, error.str())
            _log.debug("%s: %s", source, error.str())
        elif then is not None:
            then(error)
        else:
            self._lines.warning(f"error {source} {code}", "Kafka client error: %s", error.str())

    def on_stats(self, source: str, text: str) -> None:
        try:
            brokers = json.loads(text).get("brokers") or {}
        except (ValueError, AttributeError):
            return
        up = [b for b in brokers.values() if isinstance(b, dict) and b.get("state") == "UP"]
        if not up:
            return
        self.refusal = None  # UP: authenticated
        idle = [b.get("rxidle") for b in up]
        heard = [i for i in idle if isinstance(i, int) and i >= 0]
        if heard and min(heard) > SILENT_S * 1_000_000:
            # Connected, and yet no broker has said anything for that long, where a polled
            # client hears from one every few seconds (fetches, heartbeats): a broker frozen,
            # or a network that drops packets. No connection breaks then, so no client
            # reports its brokers down.
            self.unreachable(
                source, f"no broker has answered for {min(heard) / 1_000_000:.0f}s (connected)"
            )
            return
        self.reachable(source)

    def refused(self, source: str, text: str, then: RefusedCallback | None = None) -> None:
        """Kafka refused client ``source`` (``text``: librdkafka's words); not an outage."""
        if self.refusal is None:
            self.refusal = text
        _log.debug("%s refused: %s", source, text)
        if then is not None:
            then(text)

    def _problem(self, source: str) -> str:
        """The last connection problem of ``source``, else of any client."""
        with self._lock:
            problems = self._last_problem
            return problems.get(source) or next(reversed(problems.values()), "")

    def _note_problem(self, source: str, text: str) -> None:
        problem = _plain(text)
        with self._lock:
            self._last_problem.pop(source, None)
            self._last_problem[source] = problem
            if self._since is not None and not self._cause_specific:
                self._cause, self._cause_specific = problem, True  # for /healthz: no new line

    def unreachable(self, source: str, cause: str) -> None:
        """Client ``source`` reaches no broker (``cause``: why)."""
        with self._lock:
            if self._watchers and source not in self._watchers:
                # A client polled now and then (a producer between two moves) may report an
                # outage long over; the clients that watch the cluster all the time tell.
                return
            if self.refusal is not None:
                return  # all brokers "down" because they refused this client: not an outage
            self._saw_outage.add(source)
            if self._since is not None:
                return
            self._since = self._clock()
            self._since_wall = time.time()
            self._cause = cause
            self._cause_specific = bool(self._last_problem)
            self.down = True
        since = datetime.fromtimestamp(self._since_wall, UTC).isoformat(timespec="seconds")
        _log.warning(
            "Kafka at %s unreachable since %s: %s",
            self.servers,
            since.replace("+00:00", "Z"),
            cause,
            extra={"client": source},
        )

    def reachable(self, source: str) -> None:
        """Client ``source`` has (fresh) word from a broker."""
        if not self.down:
            return
        with self._lock:
            if self._since is None:
                return
            now = self._clock()
            if source not in self._saw_outage and now - self._since < GRACE_S:
                return  # possibly from before the outage
            seconds = now - self._since
            self._since = None
            self._cause = ""
            self._saw_outage.clear()
            self._last_problem.clear()
            self.down = False
        _log.info(
            "Kafka at %s reachable again after %.1fs",
            self.servers,
            seconds,
            extra={"client": source},
        )

    def log_line(
        self,
        source: str,
        level: int,
        facility: str,
        text: str,
        on_refused: RefusedCallback | None = None,
    ) -> None:
        """One of librdkafka's own log lines (``text`` without its thread prefix)."""
        if level >= logging.WARNING and is_refusal(None, text):
            self.refused(source, text, on_refused)
            return
        if facility in _CONNECTION_FACILITIES or level < logging.WARNING:
            if facility == "FAIL":
                self._note_problem(source, text)
            _log.debug("%s %s: %s", source, facility, text)
            return
        key = f"{facility} {_NUMBER.sub('N', text)[:200]}"
        self._lines.log(level, key, "librdkafka %s: %s", facility, text, extra={"client": source})


class _TrackerLog:
    """The ``logger`` of a client of :class:`BrokerHealth`: each librdkafka line to the tracker."""

    def __init__(
        self, health: BrokerHealth, source: str, on_refused: RefusedCallback | None = None
    ) -> None:
        self._health = health
        self._source = source
        self._on_refused = on_refused

    def log(self, level: int, fmt: str, *args: object) -> None:
        facility, text = split_log_call(fmt, args)
        self._health.log_line(self._source, level, facility, text, self._on_refused)


_every_tracker: weakref.WeakSet[BrokerHealth] = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: every tracker (and the registry) starts afresh, with new locks.

    The same objects, since the parent's transports (which the child's producers reuse) hold
    them. A lock a parent's thread held at the fork (serving an error callback during an
    outage) stayed held in the child, which then hung, its exit flush included.
    """
    BrokerHealth._trackers_lock = threading.Lock()
    for tracker in list(_every_tracker):
        tracker._start_afresh()


os.register_at_fork(after_in_child=_after_fork)


def _plain(text: str) -> str:
    """A connection error without librdkafka's timing suffix: the same cause reads the same."""
    return _AFTER.sub("", text)
