"""The moves' open transaction: their records written, written again after an abort, committed.

Errors are handled by the library's one transaction loop (:class:`pipeline._transactions.
Transactions`): when the transaction must be aborted it is, and the moves still owned are
written again in a new one (the offsets were not committed either); so are they after a
fatal error, once a new producer has taken the failed one's place (see
:mod:`pipeline._txnsteps`). An error the loop cannot cure (Kafka refusing to register the
transactional id) stops the worker: the jobs run again elsewhere, at-least-once, and their
moves were never committed.

A commit Kafka did not confirm may yet happen, so it is only asked again
(:meth:`MoveTransaction.commit`); a transaction whose abort Kafka did not confirm holds its
moves in :attr:`MoveTransaction._in_txn`, in no transaction, their partitions committed by
nobody (:meth:`MoveTransaction.stranded`), until a drain finishes the abort and writes them
again (:meth:`MoveTransaction.resume`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import TopicPartition

from pipeline._errors import KafkaUnavailableError, TransactionError
from pipeline._ratelog import RateLimitedLog
from pipeline._transactions import Transactions

if TYPE_CHECKING:
    from .._work import PartitionState
    from ..route.policy import Record

ABORTS_TOLD = 5
"""Commits not committed in a row after which it is an ERROR, not routine (a rebalance)."""

_log = logging.getLogger("pipeline.worker.moves")

Where = tuple[str, int]
Done = Callable[[bool], None]

_NOT_COMMITTED = (TransactionError, KafkaUnavailableError)
"""What the transaction loop raises after it aborted the open transaction: its moves are lost
with it and are written again, so that moves and key records in
:attr:`MoveTransaction._in_txn` are in the open transaction, or in none and their partitions
not committed (:meth:`MoveTransaction.stranded`)."""


class Pending:
    """A move submitted by the loop: its partition, offset and records, and whom to tell."""

    __slots__ = (
        "count",
        "done",
        "elsewhere",
        "move",
        "offset",
        "records",
        "state",
        "submitted",
        "where",
        "written",
    )

    def __init__(
        self,
        where: Where,
        offset: int,
        records: Sequence[Record],
        done: Done,
        move: bool,
        state: PartitionState | None = None,
        count: Callable[[], object] | None = None,
        elsewhere: Sequence[Where] = (),
    ) -> None:
        self.where = where
        self.elsewhere = elsewhere
        """Other partitions whose transaction may carry its records when ``where`` is not
        owned: the one that is becomes :attr:`where` as it is written."""
        self.offset = offset
        self.records = records
        self.done = done
        self.move = move
        self.state = state
        """The assignment of ``where`` it belongs to (None: whichever owns ``where``): once that
        assignment is over (``state.released``) it is not written, even if ``where`` is ours
        again, since the next assignment runs its job again."""
        self.written = 0
        """Its place in the order of writes (a rewrite keeps that order)."""
        self.submitted = 0
        """Its place in the order of submissions, once the drain took it from the queue."""
        self.count = count
        """Counts it in the metrics, once the transaction that holds it commits."""

    @property
    def given_up(self) -> bool:
        """Whether the assignment it came from is over (see :attr:`state`)."""
        state = self.state
        return state is not None and state.released


class MoveTransaction:
    """The moves written into the producer's open transaction; see the module docstring.

    ``dropped(where)`` is told of each partition whose moves leave the transaction because it
    is not owned any more: the new owner redoes these jobs."""

    def __init__(self, txn: Transactions, *, dropped: Callable[[Where], None]) -> None:
        self._txn = txn
        self._dropped = dropped
        self._in_txn: dict[Where, list[Pending]] = {}
        self._writes = 0
        """Moves written so far: the last one's :attr:`Pending.written`."""
        self._unwritten = False
        """The moves of :attr:`_in_txn` are in no transaction (Kafka did not answer)."""
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._aborted = 0
        """Commits aborted in a row: a few come with rebalances; many, with a record Kafka
        refuses every time (a topic written that is missing, or not allowed)."""
        self._forgotten: list[Pending] = []
        """Moves of partitions given up while their commit was unconfirmed: counted if it
        commits after all (see :meth:`forget`)."""

    @property
    def unwritten(self) -> bool:
        """Whether the moves of the last transaction wait to be written again (see
        :meth:`resume`): no new move goes in before they do."""
        return self._unwritten

    def resume(self, owned: Callable[[Where], bool]) -> bool:
        """Write again the moves of an aborted transaction, first finishing an abort Kafka did
        not confirm; returns whether moves may be written now (False while Kafka does not
        answer)."""
        if self._txn.aborting:
            self._unwritten = True  # no move goes in before that abort is finished
        if self._unwritten:
            self._rewrite(owned)
        return not self._unwritten

    def write(self, pending: Pending, owned: Callable[[Where], bool]) -> None:
        """Write ``pending``'s records into the open transaction (its partition is owned)."""
        try:
            self._txn.produce_all(pending.records)
        except _NOT_COMMITTED as exc:
            _log.warning("transaction aborted, writing its moves again: %s", exc)
            # Unless Kafka does not answer: then this move waits with the others, in _in_txn.
            self._rewrite(owned, pending.records)
        self._writes += 1
        pending.written = self._writes
        self._in_txn.setdefault(pending.where, []).append(pending)

    def touched(self) -> list[Where]:
        """Partitions with moves in the open transaction: their offsets must be sent with it."""
        return list(self._in_txn)

    def stranded(self) -> set[Where]:
        """Partitions with moves in no open transaction: the loop counted their jobs finished,
        but their records are not in Kafka, so no commit of these partitions may be made.
        Either Kafka did not answer when they were to be written again (the next drain does
        it), or the transaction failed for good (a fatal error, or Kafka refused to write them
        again: the consumer thread stops; their jobs run again with the next owner)."""
        return set() if self._txn.open else set(self._in_txn)

    def commit(
        self, offsets: list[TopicPartition], group_metadata: Any, owned: Callable[[Where], bool]
    ) -> bool:
        """Commit the open transaction with ``offsets`` (each partition with moves in it must be
        among them); returns whether it committed.

        When the transaction must be aborted (typically: the group is rebalancing, so the
        generation sent with the offsets is stale), its moves are written again in a new
        transaction and False is returned: the caller keeps polling, which completes the
        rebalance, and commits again later.

        A commit Kafka does not confirm goes on (False): the next call asks Kafka again. If it
        says committed, that commit holds the offsets sent then, not ``offsets``: the moves are
        done, and False still tells the caller that ``offsets`` wait for a commit of their own.
        """
        resumed = self.resumed
        try:
            self._txn.commit(offsets, group_metadata)
        except _NOT_COMMITTED as exc:
            return self.settle(resumed, exc, owned)
        return self.settle(resumed, None, owned)

    def call(self, offsets: list[TopicPartition], group_metadata: Any) -> Callable[[], None]:
        """The librdkafka calls of :meth:`commit`, for a helper thread (:mod:`.flight`); its
        outcome goes to :meth:`settle`, on the thread that owns the transaction."""
        return lambda: self._txn.commit(offsets, group_metadata)

    @property
    def resumed(self) -> bool:
        """Whether the next commit only asks Kafka again about one it did not confirm."""
        return self._txn.committing

    def settle(
        self, resumed: bool, exc: BaseException | None, owned: Callable[[Where], bool]
    ) -> bool:
        """What a commit's calls raised (``exc``), made into :meth:`commit`'s answer;
        ``resumed``: :attr:`resumed` before the calls. What is neither an abort nor Kafka not
        answering (a fenced producer) is raised again."""
        if isinstance(exc, KafkaUnavailableError):
            if self._txn.committing:
                self._errors.warning("commit", "moves' commit unconfirmed, asking again: %s", exc)
                return False
            self._not_committed(exc)
            self._rewrite(owned)
            return False
        if isinstance(exc, TransactionError):
            self._not_committed(exc)
            self._rewrite(owned)
            return False
        if exc is not None:
            raise exc
        self._aborted = 0
        for pending in (*(p for moves in self._in_txn.values() for p in moves), *self._forgotten):
            if pending.count is not None:
                pending.count()
        self._forgotten.clear()
        self._in_txn.clear()
        if resumed:
            _log.info("the moves' unconfirmed commit is confirmed: committed")
            return False
        return True

    def _not_committed(self, exc: Exception) -> None:
        self._forgotten.clear()  # aborted with the transaction: their next owner moves them
        self._aborted += 1
        if self._aborted < ABORTS_TOLD:
            _log.info("transaction not committed, its moves are written again: %s", exc)
            return
        self._errors.error(
            "aborts",
            "the moves' transaction was not committed %d times in a row, so no offset is "
            "committed meanwhile; Kafka may refuse one of its records every time (a topic "
            "that is missing or not allowed to this worker): %s",
            self._aborted,
            exc,
        )

    def forget(self, gone: set[Where]) -> None:
        """Partitions given up: moves of theirs still in the open transaction (a lost
        partition, whose offsets cannot be committed) are taken out by writing the transaction
        again without them."""
        if not gone & set(self._in_txn):
            return
        if self._txn.open and not self._txn.committing:
            self._rewrite(lambda where: where not in gone)
            return
        # In no transaction (written again later, without them), or in one whose commit Kafka
        # has not confirmed, which cannot be changed: committed, their offsets go with them
        # (a new owner's read of the offsets waits for its outcome); aborted, they are gone.
        if self._txn.committing:
            self._forgotten += (p for w in gone & set(self._in_txn) for p in self._in_txn[w])
        self._in_txn = {w: p for w, p in self._in_txn.items() if w not in gone}

    def _rewrite(self, owned: Callable[[Where], bool], then: Sequence[Record] = ()) -> None:
        """Abort the open transaction and write the moves of the partitions still owned (and
        ``then``) into a new one, which stays open. While Kafka does not let the abort finish,
        they wait (:attr:`_unwritten`; ``then`` too, its move being put in :attr:`_in_txn`)."""
        kept = {w: p for w, p in self._in_txn.items() if owned(w)}
        for where in set(self._in_txn) - set(kept):
            self._dropped(where)  # not ours any more: the new owner redoes these jobs
        self._in_txn = kept
        if self._txn.aborting and not self._unwritten:
            # Kafka did not confirm the abort just made: try again at the next drain, not at
            # once, so that the consumer thread goes back to polling in between.
            self._unwritten = True
            return

        # In the order they were first written: the records of one idempotency key may come
        # from moves of several partitions (one per priority), and the last one must stay last.
        again = sorted((p for moves in kept.values() for p in moves), key=_written)

        def write(txn: Transactions) -> None:
            for pending in again:
                txn.produce_all(pending.records)
            txn.produce_all(then)
            txn.producer.poll(0)

        try:
            self._txn.rewrite(write)
        except KafkaUnavailableError as exc:
            self._unwritten = True
            self._errors.warning("rewrite", "moves wait to be written again: %s", exc)
            return
        self._unwritten = False


def _written(pending: Pending) -> int:
    return pending.written
