"""The retry relay: returns retried jobs from the retry tiers to their priority topics when due.

Every worker process runs one on its own thread, with its own consumer (group
``<ns>.workers.retry``, one per namespace: :mod:`.handover`) and its own transactional
producer. A retry tier holds jobs in the order they failed; each carries its due time
(``not_before``). The relay forwards a partition's head when it is due; until then it parks the
head in memory and pauses the partition, so that a tier costs one message of memory per
partition whatever its depth. The worker picks a job's tier by its delay
(``FailurePolicy.tier_for``), so the jobs of one tier are due about as far apart as they
failed, and a head rarely holds back a job due much earlier.

A forward and the tier's consumed offset commit in one transaction (through the library's one
transaction loop, :class:`pipeline._transactions.Transactions`): a job returns once. When Kafka
aborts a transaction, the relay rewinds to what was committed and reads those jobs again. The
forwarded bytes are the job as the worker wrote it (its attempt counted, its error appended,
its priority kept).

A tier message that cannot go back to its priority topic takes a detour
(:mod:`.detours`): a job due far later than its tier allows goes to ``<ns>.deferred`` rather
than hold its partition until then; one the producer refuses as too large, or one that does not
decode, is dead-lettered. Either way the partition moves on.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from pipeline import DecodeError, Job, Priority, Settings
from pipeline._acls import Role
from pipeline._brokerhealth import BrokerHealth
from pipeline._clientlog import is_fatal
from pipeline._codec import DeadLetterCodec
from pipeline._envelopes import job_codec
from pipeline._errors import (
    KafkaUnavailableError,
    PipelineError,
    TransactionAbortedError,
)
from pipeline._job import now_ms
from pipeline._letters import letter_key
from pipeline._newclient import client
from pipeline._ratelog import RateLimitedLog
from pipeline._records import DeadLetterReason
from pipeline._topiccheck import is_missing_topic
from pipeline._topics import TopicNames, retry_group
from pipeline._transactions import Headers, MessageTooLargeError, Tally, Transactions

from .._metrics import WorkerMetrics
from ..commit.txnconfig import transactional_config
from ..intake.config import COOPERATIVE, membership_config
from .detours import Detours
from .handover import take_over
from .tieroffsets import TierOffsets
from .tiers import Tiers

_log = logging.getLogger("pipeline.worker.relay")

Where = tuple[str, int]
Parked = tuple[int, Message, str | None, str]
"""A message read from a paused partition: its due time, itself, the topic it goes to and, if
that is None (it is not a job: dead-lettered), why."""
TXN_MAX_S = 0.05
"""Forwards wait at most this long for their transaction to commit (batching them)."""
POLL_MAX_S = 0.2
IDLE_COMMIT_S = 1.0
"""How often the committed offsets of idle partitions catch up with their positions."""
TIMEOUT_S = 30.0
NOT_COMMITTED = (TransactionAbortedError, KafkaUnavailableError)
"""What the transaction loop raises for a transaction it aborted because Kafka aborted it or did
not answer in time (an outage): nothing of it is visible, so the relay reads its jobs again.
A refusal (a :class:`TransactionError` of another kind) still stops the worker, saying why."""
INIT_TIMEOUT_S = 1.0
"""How long one attempt to register the transactional id blocks (a stop waits that long)."""


class RetryRelay:
    """One worker process's relay thread; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        group_id: str,
        metrics: WorkerMetrics,
        on_failed: Callable[[BaseException], None],
    ) -> None:
        self._settings = settings
        self._names = TopicNames(settings.namespace)
        self._metrics = metrics
        self._on_failed = on_failed
        self._codec = job_codec(settings)
        self._detours = Detours(settings, DeadLetterCodec(self._codec.store))
        self._namespace = settings.namespace
        health = BrokerHealth.of(settings.bootstrap_servers)
        consumer_conf: dict[str, Any] = {
            "group.id": retry_group(settings),
            # Nothing to co-partition here: the broker's default assignor (or cooperative-sticky).
            **membership_config(
                settings.worker, classic_assignor=COOPERATIVE, remote_assignor=None
            ),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
            **settings.client_config(),
            **health.callbacks("retry relay", on_error=self._on_client_error),
        }
        self._consumer = client(Consumer, consumer_conf)
        self._tiers = Tiers(settings, self._consumer)
        txn_conf = transactional_config(settings, "relay", "retry relay producer")
        self._txn = Transactions(
            client(Producer, txn_conf),
            name="the retry relay's transactional producer",
            when_fenced=(
                "a newer generation of the retry relays' consumer group took its partitions; "
                "the worker stops: restart it"
            ),
            timeout_s=TIMEOUT_S,
            renew=lambda: client(Producer, txn_conf),  # its transactional id is this process's
            acl=(txn_conf["transactional.id"], settings.security.sasl_username, Role.WORKER.value),
        )
        self._parked: dict[Where, deque[Parked]] = {}
        """Per paused partition: its head and what came after it, with their due times."""
        self._offsets = TierOffsets(self._consumer, TIMEOUT_S)
        self._next_idle_commit = 0.0
        self._txn_started: float | None = None
        self._tally = Tally()
        """What the open transaction's forwards add to the metrics once it commits."""
        self._rewind_due = False
        self._fatal: KafkaError | None = None
        """A fatal consumer error (its group fenced it): the relay can read nothing more."""
        self._stop = threading.Event()
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._thread = threading.Thread(target=self._main, name="pipeline-relay", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @property
    def parked(self) -> int:
        return sum(len(p) for p in list(self._parked.values()))

    # -- the thread ----------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            # The tiers first: with none (in the settings or on the cluster) it ends here,
            # before it registers its transactional id or joins its group.
            tiers = self._tiers.to_read(self._stop.wait)
            if not tiers or not self._init() or not take_over(self._settings, self._stop.wait):
                return
            self._consumer.subscribe(
                tiers,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            while not self._stop.is_set() and self._fatal is None:
                self._turn()
            if self._fatal is not None:
                # As the worker's own consumer: stop the worker rather than leave retried jobs
                # waiting in their tiers behind a relay that no longer reads them.
                _log.error("fatal retry relay consumer error: %s", self._fatal.str())
                self._abort()
                self._on_failed(KafkaException(self._fatal))
                return
            self._commit()
        except PipelineError as exc:  # says what to do: no traceback
            self._on_failed(exc)
        except BaseException as exc:
            _log.exception("the retry relay failed: %s", exc)
            self._on_failed(exc)
        finally:
            with contextlib.suppress(Exception):
                self._consumer.close()
            with contextlib.suppress(Exception):
                self._txn.close(5.0)

    def _init(self) -> bool:
        """Register the transactional id; while Kafka does not answer, keep trying until
        stopped (an outage at start-up is waited out, as one later on, quietly: the consumer's
        health line already says Kafka is down). False: stopped."""
        return self._txn.init_until(self._stop.is_set, INIT_TIMEOUT_S)

    def _turn(self) -> None:
        now = now_ms()
        heads = [p[0][0] for p in self._parked.values() if p]
        wait_s = POLL_MAX_S
        if heads:
            wait_s = max(0.0, min(wait_s, (min(heads) - now) / 1000))
        if self._txn_started is not None:
            wait_s = min(wait_s, max(0.0, self._txn_started + TXN_MAX_S - time.monotonic()))
        messages = self._consumer.consume(500, wait_s)
        if self._rewind_due:
            self._rewind_due = False
            self._rewind()
            return
        try:
            for message in messages:
                self._on_message(message)
            self._release(now_ms())
        except NOT_COMMITTED as exc:  # aborted already: nothing of it is visible
            self._aborted(exc)
            return
        if self._txn_started is not None and time.monotonic() - self._txn_started >= TXN_MAX_S:
            self._commit()
        elif self._txn_started is None and time.monotonic() >= self._next_idle_commit:
            self._commit_idle()

    def _on_client_error(self, error: KafkaError) -> None:
        """The consumer's errors other than connection ones (called while it polls)."""
        if is_fatal(error):
            self._fatal = error
        else:
            self._errors.warning("client", "retry relay client error: %s", error.str())

    def _commit_idle(self) -> None:
        """Commit the position of idle partitions where it passed what was committed.

        A transaction's commit marker takes an offset in the tier too, after the last job
        forwarded; only the position shows it was read. Without this, a drained tier would show
        a lag of one per transaction.
        """
        self._next_idle_commit = time.monotonic() + IDLE_COMMIT_S
        try:
            self._offsets.commit_idle(self._parked)
        except KafkaException as exc:
            self._errors.warning("idle commit", "retry relay offset commit failed: %s", exc)

    def _on_message(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if is_missing_topic(error):
                self._tiers.check()
            elif is_fatal(error):
                self._fatal = error
            elif error.code() != KafkaError._PARTITION_EOF:
                self._errors.warning("consume", "retry relay consumer error: %s", error.str())
            return
        where = (message.topic() or "", message.partition() or 0)
        if not self._offsets.owns(where):
            return  # not ours any more
        parked = self._parked.get(where)
        now = now_ms()
        job: Job | None = None
        target: str | None = None
        due, why = 0, ""  # not a job: dead-lettered in its turn
        try:
            job = self._codec.decode(message.value() or b"")
            target, due = self._names.jobs(Priority(job.priority)), job.not_before or 0
        except (DecodeError, ValueError) as exc:
            why = str(exc)
        if job is not None and target is not None and self._detours.too_far(message, job, now):
            target, due = self._detours.deferred, 0  # parked, it would hold every job behind it
        if parked:
            parked.append((due, message, target, why))  # in its turn, after the head
        elif due <= now:
            self._send(message, target, why, job)
        else:
            self._parked[where] = deque([(due, message, target, why)])
            self._consumer.pause([TopicPartition(*where)])

    def _release(self, now: int) -> None:
        for where, parked in list(self._parked.items()):
            while parked and parked[0][0] <= now:
                _, message, target, error = parked.popleft()
                self._send(message, target, error)
            if not parked:
                del self._parked[where]
                # resume() fetches after the last message delivered: after the parked ones.
                self._consumer.resume([TopicPartition(*where)])

    def _send(
        self, message: Message, target: str | None, error: str, job: Job | None = None
    ) -> None:
        """Forward ``message`` (``job``, decoded again if None) unchanged to ``target``, or
        dead-letter it (see the module docstring): in the open transaction, with its offset."""
        metrics = self._metrics
        if target is None:
            self._produce(
                self._names.dlq, self._detours.undecodable(message, error), message, letter=True
            )
            self._tally.add(metrics.count_move, "?", True, DeadLetterReason.DECODE_ERROR)
            return
        value = message.value() or b""
        job = job or self._codec.decode(value)  # it decoded when it was read
        try:
            self._produce(target, value, message, message.headers(), too_large_raises=True)
        except MessageTooLargeError:  # refused, it would abort every transaction
            letter = self._detours.too_large(job, message, target)
            self._produce(self._names.dlq, letter, message, letter=True)
            self._tally.add(metrics.count_move, "?", True, DeadLetterReason.TOO_LARGE)
            return
        if target == self._detours.deferred:
            self._tally.add(metrics.count_move, "?", False, "deferred")
        else:
            self._tally.add(metrics.count, metrics.relayed, message.topic() or "")

    def _produce(
        self,
        topic: str,
        value: bytes,
        source: Message,
        headers: Headers = None,
        too_large_raises: bool = False,
        *,
        letter: bool = False,
    ) -> None:
        """Write ``value`` into the open transaction, with ``source``'s offset and key (a dead
        ``letter``'s: :func:`pipeline._letters.letter_key` of it)."""
        if self._txn_started is None:
            self._txn_started = time.monotonic()
        key = source.key()
        if letter:
            key = letter_key(key, self._detours.max_bytes)
        self._txn.produce(topic, value, key, headers=headers, too_large_raises=too_large_raises)
        where = (source.topic() or "", source.partition() or 0)
        self._offsets.forwarded(where, source.offset() or 0)

    # -- transactions --------------------------------------------------------------------------

    def _commit(self) -> None:
        if self._txn_started is None:
            return
        offsets = self._offsets.to_commit()
        try:
            self._txn.commit(offsets, self._consumer.consumer_group_metadata())
        except NOT_COMMITTED as exc:  # an outage too: the worker waits it out, as its consumer
            self._aborted(exc)
            return
        self._txn_started = None
        self._offsets.committed(offsets)
        self._metrics.count_transaction()
        self._tally.committed()  # an aborted transaction's jobs are read and forwarded again

    def _aborted(self, exc: TransactionAbortedError | KafkaUnavailableError) -> None:
        _log.warning("retry relay transaction aborted, reading again: %s", exc)
        self._txn_started = None
        self._tally.drop()
        # Forget the forwards now; read them again after the next poll, not here: this may be
        # a rebalance callback (the commit of a revocation), where a blocking consumer call
        # (the rewind asks for the committed offsets) breaks the client's per-thread state.
        self._offsets.abandon()
        self._parked.clear()
        self._rewind_due = True

    def _abort(self) -> None:
        if self._txn_started is None:
            return
        self._txn_started = None
        self._tally.drop()
        self._txn.abort()

    def _rewind(self) -> None:
        """After an abort: forget the uncommitted forwards and read them again.

        A commit Kafka did not confirm may yet be committed: its outcome is learnt first, or
        the committed offsets read now would be those before it, and its forwards would go out
        a second time once it ends."""
        if self._txn.committing:
            try:
                self._txn.commit()  # no offsets: it only ends the commit under way
            except TransactionAbortedError:
                pass  # aborted after all: read its jobs again
            except KafkaUnavailableError:
                self._rewind_due = True  # asked again on the next turn
                return
        self._parked.clear()
        try:
            self._offsets.rewind()
        except KafkaException as exc:  # Kafka down: read nothing until it answers
            self._errors.warning(
                "rewind", "retry relay: reading the committed offsets failed: %s", exc
            )
            self._rewind_due = True

    # -- rebalances ----------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            _log.info("retry tier partitions assigned", extra={"partitions": len(partitions)})
        for tp in partitions:
            self._offsets.assign((tp.topic, tp.partition))
        consumer.incremental_assign(partitions)
        consumer.resume(partitions)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit()  # while they are still ours
        self._forget(partitions)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        if self._offsets.pending(gone):
            # Their forwards cannot commit with their offsets any more: undo the transaction.
            # (The rewind reads committed offsets: not inside this callback, after the poll.)
            self._abort()
            self._forget(partitions)
            self._rewind_due = True
        else:
            self._forget(partitions)
        consumer.incremental_unassign(partitions)

    def _forget(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            where = (tp.topic, tp.partition)
            self._parked.pop(where, None)
            self._offsets.forget(where)
