"""The relay: committed outbox rows to Kafka in id order, deleted once Kafka has them.

One relay per table is active (:mod:`._lock`); the others wait as standbys. The active one:

1. reads the next rows in id order, up to ``batch_size`` of them, ``batch_max_bytes`` of
   values and as many id ranges as a progress record holds (:mod:`._batch`; a short read
   transaction);
2. produces them, in that order, in one Kafka transaction of an idempotent, transactional
   producer (``transactional.id`` ``<ns>.outbox-relay.<table>``) and commits it;
3. deletes those rows and commits the database transaction; then reads the next batch.

A row is deleted only after Kafka committed the transaction that holds it. A relay killed in
step 2 leaves an open transaction that the next active relay's registration of the same
transactional id aborts: workers read committed records only, so nothing of it is ever seen
and the rows are published again. A relay killed between 2 and 3 (between the two commits)
leaves rows already in Kafka: the transaction of step 2 also wrote the ids of its rows to the
relay's own topic (:mod:`._progress`), and the next active relay deletes them before it reads,
so they are not published twice. The registration also fences an old active relay that lost
its lock without noticing: its next commit fails.

While Kafka does not answer, the batch is retried (a warning each time, the rows stay), after
the last committed record is read back as at takeover: a commit that timed out in librdkafka may
have gone through, and its rows are then deleted rather than published again. A row
for a topic Kafka does not have waits, with the rows after it, until the topic exists, and a
row whose topic name Kafka refuses waits until it is fixed or deleted (:mod:`._topicgate`), as
do a row whose columns have the wrong types (:mod:`._typegate`), one larger than the producer
sends (:mod:`._sizegate`) and one Kafka refuses at the commit, found by publishing its batch
again in halves (:mod:`._refusalgate`); while the database does not answer, the relay gives up
being active and tries again as a standby.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaException, Producer

from .._brokerhealth import BrokerHealth
from .._errors import (
    ConfigurationError,
    KafkaUnavailableError,
    NotAuthorizedError,
    TransactionAbortedError,
    TransactionFencedError,
)
from .._newclient import client
from .._producer import message_max_bytes, producer_config
from .._ratelog import RateLimitedLog
from .._settings import Settings
from .._topiccheck import topic_name_problem
from .._transactions import Transactions
from ._batch import read_batch
from ._conninfo import RELAY_KEEPALIVES
from ._dialect import (
    SQLITE,
    Dialect,
    OutboxRow,
    connect_to_read,
    wal_on,
)
from ._gates import Gates
from ._lock import RelayLock, lock_for
from ._options import RelayOptions, relay_transactional_id
from ._progress import CommittedBatch, RelayProgress, progress_topic, still_there
from ._stall import StallWatch, saying_kafka_is_away
from ._writer import create_table

__all__ = ["OutboxRelay"]

_log = logging.getLogger("pipeline.outbox")
_LOCK_CHECK_S = 1.0
"""How often the active relay checks that it still holds its lock."""
_CLIENT = "outbox relay"
"""The relay's producer, in the health tracker's lines."""
_AWAY_LOG_S = 30.0
"""How often a relay waiting for the database or Kafka to answer says so."""


class OutboxRelay:
    """Publishes the rows of one outbox table; :meth:`run` until ``stop`` is set."""

    def __init__(self, settings: Settings, dsn: str, options: RelayOptions | None = None) -> None:
        self.settings = settings
        self.dsn = dsn
        self.options = options or RelayOptions()
        topic = progress_topic(settings.namespace, self.options.table)
        problem = topic_name_problem(topic)
        if problem is not None:
            raise ConfigurationError(
                f"the relay's own topic for table {self.options.table!r} would be {topic!r}, "
                f"which Kafka refuses ({problem}): use a shorter table name or namespace"
            )
        self.relayed = 0
        """Rows published and deleted by this relay so far."""
        self.active = threading.Event()
        """Set while this relay holds the lock and publishes."""
        self._lock: RelayLock = lock_for(dsn, self.options.table)

    def run(self, stop: threading.Event) -> None:
        """Be a standby until the lock is free, then publish; until ``stop`` is set."""
        options = self.options
        waiting = False
        lock_failed_logged = -_AWAY_LOG_S
        failures = RateLimitedLog(_log, interval_s=_AWAY_LOG_S)
        while not stop.is_set():
            try:
                got = self._lock.try_acquire()
            except ConfigurationError:
                raise
            except Exception as exc:  # any driver's error: the database is away
                if time.monotonic() - lock_failed_logged >= _AWAY_LOG_S:
                    lock_failed_logged = time.monotonic()
                    _log.warning("cannot take the relay lock (%s); trying again", exc)
                stop.wait(options.standby_retry_s)
                continue
            lock_failed_logged = -_AWAY_LOG_S
            if not got:
                if not waiting:
                    _log.info(
                        "standby: another relay of table %s is active; waiting for its lock",
                        options.table,
                    )
                    waiting = True
                stop.wait(options.standby_retry_s)
                continue
            waiting = False
            try:
                self._run_active(stop)
            except (TransactionFencedError, NotAuthorizedError) as exc:  # its id refused too
                _log.error("%s; back to standby", exc)
            except ConfigurationError:
                raise
            except Exception as exc:  # the database (or Kafka) failed under us, or before
                self._failed(exc, failures)
            else:
                continue  # stopped, or the lock lost (a standby now): nothing failed
            finally:
                self.active.clear()
                self._lock.release()
            # A pause, the lock released, before the next try: a producer failing for good while
            # the lock stays ours (fenced by a relay of another database with this table name,
            # refused its transactional id) would otherwise be replaced at once, for ever.
            stop.wait(options.standby_retry_s)

    def _failed(self, exc: Exception, failures: RateLimitedLog) -> None:
        if self.active.is_set():
            _log.warning("%s; no longer active, trying again", exc)
        else:  # it never got going: the table's schema missing, a refusal...
            failures.warning("start", "cannot start publishing (%s); trying again", exc)

    # -- the active relay -------------------------------------------------------------------------

    def _run_active(self, stop: threading.Event) -> None:
        options, settings = self.options, self.settings
        # Keepalives: a connection a NAT or firewall dropped silently would hang the relay.
        connection, dialect = connect_to_read(self.dsn, RELAY_KEEPALIVES)
        txn: Transactions | None = None
        progress: RelayProgress | None = None
        stall = StallWatch(options.table)
        try:
            create_table(connection, options.table)
            producer = self._producer()
            txn = self._transactions(producer)
            _log.info(
                "active: publishing the rows of %s to Kafka at %s",
                options.table,
                settings.bootstrap_servers,
            )
            waiting = saying_kafka_is_away(stop, settings.bootstrap_servers, txn.producer.poll)
            if not txn.init_until(waiting):
                return
            progress = RelayProgress(settings, options.table)
            if not self._recover(connection, dialect, progress, stop):
                return
            self.active.set()
            health = BrokerHealth.of(settings.bootstrap_servers)
            gates = Gates(options.table, producer, message_max_bytes(settings))
            checked = time.monotonic()
            wal = dialect is not SQLITE or wal_on(connection)
            while not stop.is_set():
                wal = wal or wal_on(connection)  # see wal_on: the file was in use at the start
                if time.monotonic() - checked >= _LOCK_CHECK_S:
                    if not self._lock.held():
                        _log.warning("lost the relay lock of %s; back to standby", options.table)
                        return
                    checked = time.monotonic()
                txn.producer.poll(0)  # serves librdkafka's callbacks: its errors, health lines
                if not (rows := self._next_rows(connection, dialect, gates, stop)):
                    continue
                if (failed := self._publish(txn, rows, progress, stall)) is not None:
                    if not self._not_taken(
                        txn, gates, rows, failed,
                        connection=connection, dialect=dialect, progress=progress,
                        stall=stall, stop=stop,
                    ):  # fmt: skip
                        return  # stopped
                    continue
                health.reachable(_CLIENT)  # Kafka took a batch: an outage it logged is over
                self._delete(connection, dialect, [row[0] for row in rows])
                self.relayed += len(rows)
        finally:
            if txn is not None:
                txn.close()
            if progress is not None:
                progress.close()
            stall.close()
            connection.close()

    def _next_rows(
        self, connection: Any, dialect: Dialect, gates: Gates, stop: threading.Event
    ) -> list[OutboxRow]:
        """The next batch up to its first row that waits (each gate logs why); none, after a
        pause: the table is empty, or its first row waits."""
        options = self.options
        batch = read_batch(
            connection, dialect, options.table, options.batch_size, options.batch_max_bytes
        )
        if not batch and batch.malformed is None:
            stop.wait(options.poll_interval_s)
            return []
        if not (rows := gates.passable(batch)):  # its first row is held (see ._gates)
            stop.wait(options.retry_s)
        return rows

    def _not_taken(
        self,
        txn: Transactions,
        gates: Gates,
        rows: list[OutboxRow],
        failed: Exception,
        *,
        connection: Any,
        dialect: Dialect,
        progress: RelayProgress,
        stall: StallWatch,
        stop: threading.Event,
    ) -> bool:
        """After Kafka did not take ``rows`` (``failed``): at once if it refused them (smaller
        batches find the row it refuses: :mod:`._gates`), else once Kafka answers again and the
        last batch it committed was read back. False: stopped first."""
        try:
            if gates.not_taken(rows, failed):
                return True
            _log.warning(
                "Kafka did not take %d outbox rows from id %d (%s); they stay in %s, "
                "retrying in %gs",
                len(rows), rows[0][0], failed, self.options.table, self.options.retry_s,
            )  # fmt: skip
            stop.wait(self.options.retry_s)
            # A commit whose answer never came may have committed: its outcome is learnt, then
            # what Kafka has is read back (and its rows deleted) before the rows go out again.
            # The batch waits for Kafka until then.
            settled = self._settle(txn, stop)
            return settled and self._recover(connection, dialect, progress, stop)
        finally:
            stall.end()

    def _settle(self, txn: Transactions, stop: threading.Event) -> bool:
        """Learn the outcome of a commit Kafka did not confirm (:attr:`Transactions.committing`)
        before the last batch is read back. Read back while that commit still goes on, the batch
        would not show yet, and the next transaction, which ends that commit first, would publish
        its rows a second time. False: stopped first."""
        while txn.committing:
            try:
                txn.commit()  # no offsets: it only ends the commit under way
            except TransactionAbortedError:
                return True  # Kafka aborted it: nothing of it is visible, the rows go again
            except KafkaUnavailableError:
                if stop.wait(self.options.retry_s):
                    return False
        return not stop.is_set()

    def _recover(
        self, connection: Any, dialect: Dialect, progress: RelayProgress, stop: threading.Event
    ) -> bool:
        """Delete the rows of the last batch Kafka committed, should they still be there (the
        relay before stopped between Kafka's commit and the database's, or this one never heard
        back from its commit). False: stopped first."""
        unread = RateLimitedLog(_log, interval_s=_AWAY_LOG_S)
        while not stop.is_set():
            try:
                progress.ensure_topic(timeout=10.0)
                batch = progress.last_committed(timeout=10.0)
            except KafkaException as exc:
                unread.warning(
                    "unread",
                    "cannot read the last committed batch of %s from Kafka (%s); trying again",
                    self.options.table,
                    exc.args[0] if exc.args else exc,
                )
                stop.wait(self.options.retry_s)
                continue
            except ValueError as exc:  # another writer's record on the relay's own topic
                _log.error(
                    "the last progress record of %s on %s is not one a relay wrote (%s): "
                    "ignored, so rows of the last batch still in the table go out again (their "
                    "idempotency keys, if they have any, run them once)",
                    self.options.table, progress.topic, exc,
                )  # fmt: skip
                batch = CommittedBatch([], None)
            ids = still_there(connection, dialect, self.options.table, batch)
            deleted = self._delete(connection, dialect, ids) if ids else 0
            if deleted:
                _log.warning(
                    "%d rows of the last batch Kafka committed (ids %d to %d) were still in %s "
                    "(a relay stopped between Kafka's commit and the database's, or did not "
                    "hear back from its commit): deleted, not published again",
                    deleted,
                    ids[0],
                    ids[-1],
                    self.options.table,
                )
            return True
        return False

    def _delete(self, connection: Any, dialect: Dialect, ids: list[int]) -> int:
        """Delete rows ``ids`` and commit; how many there were."""
        cursor = connection.cursor()
        try:
            deleted = dialect.delete(cursor, self.options.table, ids)
        finally:
            cursor.close()
        connection.commit()
        return deleted

    def _publish(
        self, txn: Transactions, rows: list[OutboxRow], progress: RelayProgress, stall: StallWatch
    ) -> KafkaUnavailableError | TransactionAbortedError | None:
        """One Kafka transaction with ``rows`` in order, then the record of their ids; the
        error when Kafka did not take it (None: taken). ``stall`` says when Kafka holds it up,
        and still watches the batch when Kafka did not take it (the caller ends the watch)."""

        def write(txn: Transactions) -> None:
            for _, topic, key, value, _job_id in rows:
                txn.produce(topic, value, key)
            txn.produce(progress.topic, progress.value(rows), progress.key)

        stall.begin(len(rows), rows[0][0])
        try:
            txn.run(write)
        except (KafkaUnavailableError, TransactionAbortedError) as exc:
            return exc
        stall.end()
        return None

    def _producer(self) -> Producer:
        settings = self.settings
        txn_id = relay_transactional_id(settings.namespace, self.options.table)
        conf = producer_config(settings, bulk=True)
        conf.update(
            {
                "transactional.id": txn_id,
                "transaction.timeout.ms": max(60_000, conf["delivery.timeout.ms"]),
            }
        )
        # librdkafka's errors and log lines go to the cluster's health tracker: one line when
        # Kafka becomes unreachable, one when it is back.
        conf.update(BrokerHealth.of(settings.bootstrap_servers).callbacks(_CLIENT))
        return client(Producer, conf)

    def _transactions(self, producer: Producer) -> Transactions:
        table = self.options.table
        txn_id = relay_transactional_id(self.settings.namespace, table)
        return Transactions(
            producer,
            name=f"the outbox relay of {table} (transactional id {txn_id})",
            when_fenced="another relay of this table became active",
            timeout_s=10.0,
        )
