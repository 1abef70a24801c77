"""The scheduler process: a standby until it owns the control partition, then the leader."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType

from confluent_kafka import KafkaException

from pipeline import Pipeline, Settings
from pipeline._authfailure import authentication_error
from pipeline._brokerhealth import BrokerHealth
from pipeline._errors import (
    KafkaAuthenticationError,
    KafkaUnavailableError,
    NotAuthorizedError,
    PipelineError,
    TopicMissingError,
    TransactionError,
    TransactionFencedError,
)
from pipeline._metricsserver import MetricsServer
from pipeline._records import Schedule

from ._leadership import Leadership, MembershipEndedError
from ._metrics import SchedulerMetrics
from ._session import LeaderSession

_log = logging.getLogger("pipeline.scheduler")
STANDBY_POLL_S = 0.05
"""A standby's wait in the leadership group's poll: the poll that serves the assignment returns
only at its timeout, so this is how late a standby starts leading after it is assigned."""
STALL_S = 30.0
"""``/healthz`` fails when the loop has not turned for this long (a term's start aside)."""
START_RETRY_S = 1.0
"""The wait between two attempts to start a term."""
START_ATTEMPTS = 3
"""Failed starts of a term after which this process gives the lead up (:data:`START_BUDGET_S`
bounds them in time). One failure can be a moment's trouble (a broker restarting, a partition
electing its leader) that the next attempt, a second later, gets past; three in a row are a
pattern: a state topic too large to read in time, a broker this host cannot reach. Giving up
costs a standby's takeover (a rebalance, the fencing, its read of the state: seconds), so it
can be done early; a process that no other one can replace is given the lead back."""
START_BUDGET_S = 120.0
"""The most time a process holds the lead without a term before it gives it up, whatever the
count of failed starts: reading the state alone may take 60 s (``load_state``) before it fails,
so two such attempts give up at most two minutes in. A start that has run this long by itself
never returned to give the lead up: ``/healthz`` fails then (:meth:`Scheduler.health`)."""

EXIT_FENCED = 3
EXIT_SETUP = 1
"""The namespace's topics do not exist."""
EXIT_REFUSED = KafkaAuthenticationError.exit_code
"""Kafka refused the credentials (or the TLS handshake), or this user may not write a topic a
leader writes (:class:`NotAuthorizedError`)."""


class LeadershipLostError(KafkaUnavailableError):
    """The leadership group revoked this scheduler during a transaction step's retries: the
    term ends as one whose transaction was not committed (the next leader fences it anyway)."""


class Scheduler:
    """Runs until :meth:`stop` (or SIGTERM/SIGINT): standby, or leader while it owns leadership.

    With an application, the schedules it registered with ``app.schedule(...)`` are published
    to ``<ns>.schedules`` each time this process becomes the leader, and a cron fire of one of
    its job types takes the type's declared priority and max attempts where the schedule names
    none.
    """

    def __init__(self, settings: Settings | None = None, app: Pipeline | None = None) -> None:
        if settings is None:
            settings = app.settings if app is not None else Settings()
        self.settings = settings
        self.app = app
        self.metrics = SchedulerMetrics()
        self.metrics.watch(self._held, self._parked)
        self.session: LeaderSession | None = None
        self.metrics_port: int | None = None
        self._stop = threading.Event()
        self._signals = 0
        self._last_turn = time.monotonic()
        self._leadership: Leadership | None = None
        self._no_term_since: float | None = None
        """Since when (monotonic) this process holds the lead without a term."""
        self._starting_since: float | None = None
        """Since when (monotonic) the start of a term runs; ``None`` when none does."""
        self._failed_starts = 0
        self._start_error = ""
        self.broker = BrokerHealth.of(settings.bootstrap_servers)
        """Whether this process reaches Kafka (fed by every client of that cluster)."""

    def _schedules(self) -> list[Schedule]:
        return list(getattr(self.app, "schedules", {}).values()) if self.app is not None else []

    def _held(self) -> float:
        session = self.session
        return float(session.held) if session is not None else 0.0

    def _parked(self) -> float:
        session = self.session
        return float(session.parked) if session is not None else 0.0

    @property
    def is_leader(self) -> bool:
        return self.session is not None

    def stop(self) -> None:
        self._stop.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            os._exit(1)
        _log.info("stopping: finishing the current transaction", extra={"signal": signum})
        self._stop.set()

    def _role(self) -> str:
        if self.is_leader:
            return "leader"
        failed = (
            f"{self._failed_starts} failed start{'s' if self._failed_starts > 1 else ''}, "
            f"the last: {self._start_error}"
            if self._failed_starts
            else ""
        )
        if self._starting_since is not None:
            return f"leader, starting its term{f' ({failed})' if failed else ''}"
        if self._no_term_since is not None:
            return f"leader without a term ({failed})"
        return "standby"

    def health(self) -> tuple[bool, str]:
        """``/healthz``: :meth:`live`, Kafka not unreachable for ``unhealthy_after_s`` and the
        credentials not refused."""
        role = self._role()
        if self.broker.refusal is not None:
            return False, f"{role}: {authentication_error(self.settings, self.broker.refusal)}"
        down = self.broker.unreachable_for()
        if down is not None and down >= self.settings.scheduler.unhealthy_after_s:
            return False, f"{role}: {self.broker.describe()}"
        return self.live()

    def live(self) -> tuple[bool, str]:
        """``/livez``: whether the loop turns, what a restart mends (Kafka unreachable is not:
        schedulers restarted in an outage may still be in their back-off when it ends).

        A term's start is not a stall (reading the state may take a minute) until it has run
        :data:`START_BUDGET_S`: then it cannot give the lead up, and only a restart makes the
        process leave the group. A process whose starts fail gives the lead up by itself and
        stays live: restarted, a lone scheduler would fail the same way, and stop trying
        while it is restarted."""
        now = time.monotonic()
        role = self._role()
        starting = self._starting_since
        if starting is not None:
            if now - starting <= START_BUDGET_S:
                return True, role
            return False, (
                f"{role}: stuck, the start of its term has run {now - starting:.0f} s, more than "
                f"the {START_BUDGET_S:.0f} s after which a scheduler gives the lead up; it "
                "holds the lead, so no other scheduler can take it until it is restarted"
            )
        stalled = now - self._last_turn > STALL_S
        return (not stalled, f"{role}{' (stalled)' if stalled else ''}")

    def run(self) -> int:
        """Run until stopped; return the exit code (3 when fenced by another leader, 4 when
        Kafka refused the credentials or the ACLs lack a topic a leader writes)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        port = self.settings.scheduler.metrics_port
        server = (
            MetricsServer(self.metrics.registry, self.health, port, live=self.live)
            if port is not None
            else None
        )
        self.metrics_port = server.port if server is not None else None
        wait = self.settings.scheduler.max_wait_s
        leadership: Leadership | None = None
        code = 0
        try:
            leadership = self._leadership = Leadership(self.settings)
            _log.info("scheduler started", extra={"namespace": self.settings.namespace})
            while not self._stop.is_set():
                self._last_turn = time.monotonic()
                if self.broker.refusal is not None:
                    raise authentication_error(self.settings, self.broker.refusal)
                self._turn(leadership, wait)
        except TransactionFencedError as exc:
            _log.error("fenced by another scheduler: exiting", extra={"error": str(exc)})
            code = EXIT_FENCED
        except TopicMissingError as exc:
            _log.error("stopping: %s", exc)
            code = EXIT_SETUP
        except MembershipEndedError as exc:
            _log.error("stopping: %s", exc)
            code = 1
        except (KafkaAuthenticationError, NotAuthorizedError) as exc:
            # Not an outage: librdkafka would retry forever, and a restart cannot help either.
            _log.error("stopping: %s", exc)
            code = EXIT_REFUSED
        finally:
            self._end_session()
            if leadership is not None:
                leadership.close()
            if server is not None:
                server.close()
            _log.info("scheduler stopped")
        return code

    def _turn(self, leadership: Leadership, wait: float) -> None:
        """One turn of the loop: stand by, start a term (or give the lead up), or step it."""
        if not leadership.is_leader:
            self._end_session()
            self._forget_starts()
            leadership.poll(min(wait, STANDBY_POLL_S))
            return
        if self.session is None and not self._start_session():
            if self._starts_exhausted():
                self._give_up_lead(leadership)
            else:
                self._stop.wait(START_RETRY_S)
                leadership.poll(0)
            return
        self._step()
        leadership.poll(0)

    def _step(self) -> None:
        """One step of the term, which ends when its transaction is not committed (nothing of
        it is visible: the next term starts again from what Kafka committed) or its topics
        gained partitions (what is open is aborted and read again by the next term)."""
        session = self.session
        assert session is not None
        try:
            session.step()
        except LeadershipLostError as exc:  # not an abort: the next leader goes on from here
            _log.info(
                "no longer the leader during a transaction's retries", extra={"error": str(exc)}
            )
            self._end_session()
            return
        except (TransactionError, KafkaUnavailableError) as exc:
            _log.warning("transaction not committed: rewinding", extra={"error": str(exc)})
            self.metrics.aborts.inc()
            self._end_session()
            return
        if session.partitions_changed():
            self._end_session()

    def _start_session(self) -> bool:
        registry = self.app.registry if self.app is not None else None
        session = LeaderSession(
            self.settings, self.metrics, self._schedules(), registry, serve=self._serve
        )
        now = time.monotonic()
        if self._no_term_since is None:
            self._no_term_since = now
        self._starting_since = now
        try:
            session.start()
        except TransactionFencedError:
            session.close()
            raise
        except (KafkaAuthenticationError, NotAuthorizedError, TopicMissingError):
            session.close()  # none goes away by trying again: the process stops
            raise
        except (PipelineError, KafkaException) as exc:
            _log.error("could not take the lead; retrying", extra={"error": str(exc)})
            session.close()
            self._failed_starts += 1
            self._start_error = str(exc)
            return False
        finally:
            self._starting_since = None
        self._forget_starts()
        self.session = session
        self.metrics.is_leader.set(1)
        return True

    def _forget_starts(self) -> None:
        self._no_term_since = None
        self._failed_starts = 0
        self._start_error = ""

    def _starts_exhausted(self) -> bool:
        held = time.monotonic() - (self._no_term_since or time.monotonic())
        return self._failed_starts >= START_ATTEMPTS or held >= START_BUDGET_S

    def _give_up_lead(self, leadership: Leadership) -> None:
        """Leave the leadership group for :attr:`Leadership.handover_s`, so that a standby
        takes the lead this process holds without a term, then join again: as a standby, or,
        where no other process took the lead, as the leader that tries again."""
        held = time.monotonic() - (self._no_term_since or time.monotonic())
        _log.warning(
            "could not start a term %d times in %.0f s: giving the lead up, for another "
            "scheduler to take it",
            self._failed_starts,
            held,
            extra={"error": self._start_error},
        )
        self._forget_starts()
        leadership.leave()
        out_until = time.monotonic() + leadership.handover_s
        while not self._stop.is_set() and (left := out_until - time.monotonic()) > 0:
            self._last_turn = time.monotonic()  # waiting is not a stall
            self._stop.wait(min(left, 1.0))
        if not self._stop.is_set():
            leadership.rejoin()

    def _serve(self, seconds: float) -> None:
        """Wait between two attempts of a transaction step while Kafka is down, serving the
        leadership group meanwhile: a revocation is seen, the membership never lapses. Revoked,
        the term ends at once (:class:`LeadershipLostError`) rather than retry a transaction
        the next leader fences anyway."""
        self._last_turn = time.monotonic()
        if self._leadership is None:
            time.sleep(seconds)
            return
        self._leadership.poll(seconds)
        if not self._leadership.is_leader:
            raise LeadershipLostError(
                "the leadership moved to another scheduler while a transaction step waited to "
                "be tried again; this term ends"
            )

    def _end_session(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            self.metrics.is_leader.set(0)
            try:
                session.close()
            except KafkaException as exc:
                _log.warning("closing the leader session failed", extra={"error": str(exc)})
            _log.info("no longer leading")
