"""Moves of failed jobs and the offsets that go with them, in Kafka transactions.

A failed job leaves its partition by a *move*: to a retry tier, to ``<ns>.deferred`` or to the
dead-letter topic. The move is written by a transactional producer, and the transaction commits
with the consumed offsets (``send_offsets_to_transaction``), so either both the move and the
offset land or neither does: a crash never loses a move nor makes one twice (DESIGN section 6).
The moved offset may sit above the partition's commit point (a job below it still runs), so
the commit's metadata lists it (:class:`.marks.CommitMark`) and a new owner skips it.

Threads: the event loop submits moves (:meth:`Mover.submit`, any thread); the consumer thread,
which owns the producer's transactions as it owns the consumer, writes them (:meth:`drain`) and
commits (:meth:`commit`). A move's job is finished only after its records are in the open
transaction, so a commit that covers its offset always carries its records.

Errors follow librdkafka's transactional API: a retriable error is retried; an abortable one
aborts the transaction, writes its moves again in a new one and commits that (the offsets were
not committed either); a fatal one, a fenced producer included, stops the worker (the jobs run
again elsewhere: at-least-once, and their moves were never committed).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from pipeline._brokerhealth import BrokerHealth
from pipeline._producer import producer_config

from .marks import MAX_MOVED

if TYPE_CHECKING:
    import asyncio

    from pipeline import Settings

    from ..route.policy import Record

_log = logging.getLogger("pipeline.worker.moves")

Where = tuple[str, int]
Done = Callable[[bool], None]
ATTEMPTS = 5
TIMEOUT_S = 30.0


class MoveFailedError(Exception):
    """The transactional producer failed for good (fenced or fatal): the worker must stop."""


class _Pending:
    __slots__ = ("done", "move", "offset", "records", "where")

    def __init__(
        self, where: Where, offset: int, records: Sequence[Record], done: Done, move: bool
    ) -> None:
        self.where = where
        self.offset = offset
        self.records = records
        self.done = done
        self.move = move


class Mover:
    """The worker's transactional producer; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        loop: asyncio.AbstractEventLoop,
        *,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        conf: dict[str, Any] = producer_config(settings)
        # One id per process: fencing of a zombie comes from the consumer group's generation,
        # sent with the offsets (KIP-447), not from a shared transactional.id.
        conf.update(
            {
                "transactional.id": f"{settings.namespace}.worker.{uuid.uuid4().hex}",
                "linger.ms": 1,
                "transaction.timeout.ms": settings.worker.transaction_timeout_ms,
                # librdkafka wants a message's delivery to time out within its transaction's.
                "delivery.timeout.ms": settings.worker.transaction_timeout_ms,
                **BrokerHealth.of(settings.bootstrap_servers).callbacks("moves producer"),
            }
        )
        conf.update(settings.kafka)
        self._producer = producer_factory(conf)
        self._loop = loop
        self._queue: deque[_Pending] = deque()
        self._waiting: dict[Where, deque[_Pending]] = {}
        """Moves waiting because their partition has MAX_MOVED moves above its commit point."""
        self._in_txn: dict[Where, list[_Pending]] = {}
        self.moved: dict[Where, set[int]] = {}
        """Offsets moved above each partition's commit point (consumer thread)."""
        self.open = False
        self.initialized = False

    # -- any thread ----------------------------------------------------------------------------

    def submit(
        self, where: Where, offset: int, records: Sequence[Record], done: Done, *, move: bool = True
    ) -> None:
        """Queue a move; ``done(True)`` runs on the loop once it is in the open transaction,
        ``done(False)`` if the partition was given up first (the job is not finished then).

        ``move=False``: records that go with the offset of a job that stays where it is (the
        idempotency keys it settled); the offset is not skipped by a later owner.
        """
        self._queue.append(_Pending(where, offset, records, done, move))

    # -- consumer thread -----------------------------------------------------------------------

    def init(self) -> None:
        """Register the transactional id with the cluster (once, before the first move)."""
        self._call(self._producer.init_transactions, TIMEOUT_S)
        self.initialized = True

    def drain(self, owned: Callable[[Where], bool], commit_point: Callable[[Where], int]) -> bool:
        """Write queued moves into the open transaction; returns whether any was written."""
        wrote = False
        for where in [w for w, held in self._waiting.items() if held]:
            still: deque[_Pending] = deque()
            for pending in self._waiting[where]:
                if self._room(where, commit_point(where), pending.offset):
                    wrote |= self._write(pending, owned)
                else:
                    still.append(pending)
            self._waiting[where] = still
        queue = self._queue
        while queue:
            pending = queue.popleft()
            where = pending.where
            if pending.move and not self._room(where, commit_point(where), pending.offset):
                self._waiting.setdefault(where, deque()).append(pending)
                continue
            wrote |= self._write(pending, owned)
        return wrote

    def _room(self, where: Where, commit_point: int, offset: int) -> bool:
        """Whether a move of ``offset`` may be written now. The job at the commit point always
        may: the commit point then passes it, which is what makes room for the others."""
        moved = self.moved.get(where)
        if not moved or len(moved) < MAX_MOVED or offset <= commit_point:
            return True
        for stale in [o for o in moved if o < commit_point]:
            moved.discard(stale)
        return len(moved) < MAX_MOVED

    def _write(self, pending: _Pending, owned: Callable[[Where], bool]) -> bool:
        if not owned(pending.where):
            self._resolve(pending, False)
            return False
        if not self.initialized:
            self.init()
        if not self.open:
            self._call(self._producer.begin_transaction)
            self.open = True
        try:
            self._produce(pending.records)
        except _AbortableError as exc:
            _log.warning("transaction aborted, writing its moves again: %s", exc)
            self._rewrite(owned)
            self._produce(pending.records)
        if pending.move:
            self.moved.setdefault(pending.where, set()).add(pending.offset)
        self._in_txn.setdefault(pending.where, []).append(pending)
        self._resolve(pending, True)
        return True

    def touched(self) -> list[Where]:
        """Partitions with moves in the open transaction: their offsets must be sent with it."""
        return list(self._in_txn)

    def restore_moved(self, where: Where, offsets: Iterable[int]) -> None:
        """Offsets a previous owner moved above the commit point (read from its commit mark)."""
        self.moved[where] = set(offsets)

    def moved_above(self, where: Where, commit_point: int) -> tuple[int, ...]:
        """The offsets moved above ``commit_point``, for the commit's metadata."""
        moved = self.moved.get(where)
        if not moved:
            return ()
        return tuple(sorted(o for o in moved if o >= commit_point))

    def commit(
        self, offsets: list[TopicPartition], group_metadata: Any, owned: Callable[[Where], bool]
    ) -> bool:
        """Commit the open transaction with ``offsets`` (each partition with moves in it must be
        among them); returns whether it committed.

        When the transaction must be aborted (typically: the group is rebalancing, so the
        generation sent with the offsets is stale), its moves are written again in a new
        transaction and False is returned: the caller keeps polling, which completes the
        rebalance, and commits again later.
        """
        try:
            if offsets:
                self._call(
                    self._producer.send_offsets_to_transaction,
                    offsets,
                    group_metadata,
                    TIMEOUT_S,
                )
            self._call(self._producer.commit_transaction, TIMEOUT_S)
        except _AbortableError as exc:
            _log.info("transaction aborted, its moves are written again: %s", exc)
            self._rewrite(owned)
            return False
        self.open = False
        self._in_txn.clear()
        for tp in offsets:
            self._prune((tp.topic, tp.partition), tp.offset)
        return True

    def forget(self, wheres: Iterable[Where]) -> None:
        """Partitions given up: drop what we know of their moves. Moves of theirs still in the
        open transaction (a lost partition, whose offsets cannot be committed) are taken out
        by writing the transaction again without them."""
        gone = set(wheres)
        for where in gone:
            self.moved.pop(where, None)
            for pending in self._waiting.pop(where, ()):
                self._resolve(pending, False)
        if self.open and gone & set(self._in_txn):
            self._rewrite(lambda where: where not in gone)

    def close(self) -> None:
        if self.open:
            with contextlib.suppress(KafkaException):
                self._producer.abort_transaction(5.0)
            self.open = False
        self._producer.flush(5.0)

    # -- internals -----------------------------------------------------------------------------

    def _prune(self, where: Where, committed: int) -> None:
        moved = self.moved.get(where)
        if moved:
            for offset in [o for o in moved if o < committed]:
                moved.discard(offset)

    def _rewrite(self, owned: Callable[[Where], bool]) -> None:
        with contextlib.suppress(KafkaException):
            self._producer.abort_transaction(TIMEOUT_S)
        self.open = False
        kept = {w: p for w, p in self._in_txn.items() if owned(w)}
        for where in set(self._in_txn) - set(kept):
            self.moved.pop(where, None)  # not ours any more: the new owner redoes these jobs
        self._in_txn = {}
        self._call(self._producer.begin_transaction)
        self.open = True
        for where, moves in kept.items():
            for pending in moves:
                self._produce(pending.records)
            self._in_txn[where] = moves

    def _produce(self, records: Sequence[Record]) -> None:
        produce = self._producer.produce
        for record in records:
            while True:
                try:
                    if record.partition is None:
                        produce(record.topic, record.value, record.key, headers=record.headers)
                    else:
                        produce(
                            record.topic,
                            record.value,
                            record.key,
                            partition=record.partition,
                            headers=record.headers,
                        )
                    break
                except BufferError:
                    self._producer.poll(0.01)
                except KafkaException as exc:
                    self._raise(exc)
        self._producer.poll(0)

    def _resolve(self, pending: _Pending, done: bool) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is exiting
            self._loop.call_soon_threadsafe(pending.done, done)

    def _call(self, method: Callable[..., Any], *args: Any) -> None:
        for attempt in range(ATTEMPTS):
            try:
                method(*args)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and not error.txn_requires_abort() and attempt < ATTEMPTS - 1:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                self._raise(exc)

    @staticmethod
    def _raise(exc: KafkaException) -> None:
        error: KafkaError = exc.args[0]
        if error.txn_requires_abort():
            raise _AbortableError(error.str()) from exc
        raise MoveFailedError(f"the worker's transactional producer failed: {error.str()}") from exc


class _AbortableError(Exception):
    """The open transaction must be aborted (librdkafka's ``txn_requires_abort``)."""
