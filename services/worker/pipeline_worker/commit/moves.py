"""The mover: moves of failed jobs queued from the event loop, until written in a transaction.

A failed job leaves its partition by a *move*: to a retry tier, to ``<ns>.deferred`` or to the
dead-letter topic. The move is written by a transactional producer, and the transaction commits
with the consumed offsets (``send_offsets_to_transaction``), so either both the move and the
offset land or neither does: a crash never loses a move nor makes one twice (DESIGN section 6).
The moved offset may sit above the partition's commit point (a job below it still runs), so
the commit's metadata lists it (:class:`.marks.CommitMark`, apart from the finished map, which
may be cut short) and a new owner skips it.

Threads: the event loop submits moves (:meth:`Mover.submit`, any thread); the consumer thread,
which owns the producer's transactions as it owns the consumer, writes them (:meth:`drain`) and
commits (:meth:`commit`). A move's job is finished only after its records are in the open
transaction, so a commit that covers its offset always carries its records. The loop hears of
the moves a drain wrote in one callback, not one per move: a worker whose jobs carry
idempotency keys submits one for every job, and a wake-up of the loop per job would cost the
consumer thread and the loop more than the records do.

A move belongs to the assignment of its partition it was submitted for (its
:class:`PartitionState`), not just to the partition: a partition given up (its jobs still
running past the revocation's wait, see :mod:`..intake.rebalance`) may be assigned to this
worker again, and that next assignment reads and runs the job again. A move of an assignment
that is over (``state.released``) is never written, whoever owns the partition now.

What goes into the open transaction, and what becomes of it when Kafka aborts it or does not
answer, is :mod:`.movetxn`'s.

While Kafka does not answer, the consumer thread must get back to polling within seconds (or
``max.poll.interval.ms`` runs out and ``/healthz`` calls it stuck): each producer call waits at
most :data:`TIMEOUT_S`, a step is tried :data:`ATTEMPTS` time(s), and the thread's next turn,
after a poll, is the retry. While moves already written wait to be written again (see
:mod:`.movetxn`), new moves wait in the queue, their jobs unfinished: nothing is lost, nothing
committed past a move.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import Producer, TopicPartition

from pipeline._acls import Role
from pipeline._errors import KafkaUnavailableError
from pipeline._newclient import client
from pipeline._ratelog import RateLimitedLog
from pipeline._topics import TopicNames
from pipeline._transactions import STEP_TIMEOUT_S, Transactions

from .flight import Flight, Outcome
from .marks import max_moved
from .movetxn import Done, MoveTransaction, Pending, Where
from .txnconfig import transactional_config
from .waiting import WaitingMoves

if TYPE_CHECKING:
    import asyncio

    from pipeline import Settings

    from .._work import PartitionState
    from ..route.policy import Record

_log = logging.getLogger("pipeline.worker.moves")

TIMEOUT_S = STEP_TIMEOUT_S
"""The longest one producer call waits (it was 30 s, 5 times a step: minutes without a poll)."""
ATTEMPTS = 1
WHEN_FENCED = "the worker stops and its jobs run again where they are now: restart it"
"""Said when Kafka fences a new producer as it registers (one that failed for good is replaced,
see :mod:`pipeline._txnsteps`; a zombie's commit is refused by its group generation)."""


class Mover:
    """The worker's transactional producer; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        loop: asyncio.AbstractEventLoop,
        *,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        conf = transactional_config(settings, "worker", "moves producer", timeout_s=TIMEOUT_S)
        self._txn = Transactions(
            client(producer_factory, conf),
            name="the worker's transactional producer",
            when_fenced=WHEN_FENCED,
            timeout_s=TIMEOUT_S,
            attempts=ATTEMPTS,
            renew=lambda: client(producer_factory, conf),  # its transactional id is this process's
            acl=(conf["transactional.id"], settings.security.sasl_username, Role.WORKER.value),
        )
        self._loop = loop
        self._max_moved = max_moved(settings.worker.offset_metadata_max_bytes)
        self._queue: deque[Pending] = deque()
        self._waiting = WaitingMoves(TopicNames(settings.namespace).dedup)
        """Moves waiting because their partition has ``max_moved`` moves above its commit point."""
        self._taken = 0
        """Moves taken from the queue so far: the last one's :attr:`Pending.submitted`."""
        self._transaction = MoveTransaction(self._txn, dropped=self._drop_moved)
        """The moves written into the open transaction."""
        self.moved: dict[Where, set[int]] = {}
        """Offsets moved above each partition's commit point (consumer thread)."""
        self._resolved: list[tuple[Done, bool]] = []
        """What to tell the loop when the drain (or forget) that resolved these is over."""
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._flight = Flight("pipeline-txn-commit")
        """A commit made on a helper thread (:meth:`commit_async`): nothing else touches the
        transaction until the consumer thread has taken its outcome back (:meth:`land`)."""
        self.initialized = False

    @property
    def open(self) -> bool:
        """Whether a transaction is open, its commit in flight included: the partitions it
        touched commit with it."""
        return self._flight.busy or self._txn.open

    @property
    def committing(self) -> bool:
        """Whether a commit is in flight (:meth:`commit_async`), its outcome not taken back."""
        return self._flight.busy

    def open_for(self, now: float) -> float:
        """How long the open transaction has been open at ``now`` (0: none is)."""
        return now - self._txn.opened_at if self._txn.open else 0.0

    # -- any thread ----------------------------------------------------------------------------

    def submit(
        self,
        where: Where,
        offset: int,
        records: Sequence[Record],
        done: Done,
        *,
        move: bool = True,
        state: PartitionState | None = None,
        count: Callable[[], object] | None = None,
        elsewhere: Sequence[Where] = (),
    ) -> None:
        """Queue a move; ``done(True)`` runs on the loop once it is in the open transaction,
        ``done(False)`` if the partition was given up first (the job is not finished then).
        ``count()`` runs (on the consumer thread) once a transaction holding it commits.

        ``move=False``: records that go with the offset of a job that stays where it is (the
        idempotency keys it settled); the offset is not skipped by a later owner.

        ``state``: the assignment the move belongs to. The move is written only while that
        assignment lasts: a partition given up and assigned to this worker again is another
        assignment, which runs the job again (``done(False)`` then). Without it, whichever
        assignment owns ``where`` takes the move.

        ``elsewhere``: for records without an offset (``move=False``, no ``state``), the other
        partitions whose transaction may carry them when ``where`` is not owned, the first one
        owned taking them (a key of the namespace scope belongs to partition p of every priority
        topic, and a topic with fewer partitions has no p); ``done(False)`` if none is.
        """
        self._queue.append(Pending(where, offset, records, done, move, state, count, elsewhere))

    # -- consumer thread -----------------------------------------------------------------------

    def init(self) -> None:
        """Register the transactional id with the cluster (once, before the first move)."""
        self._txn.init()
        self.initialized = True

    def drain(
        self,
        owned: Callable[[Where], bool],
        commit_point: Callable[[Where], int],
        *,
        wait: bool = True,
    ) -> bool:
        """Write queued moves into the open transaction; returns whether any was written.

        A commit in flight is landed first; ``wait=False``: if it goes on, nothing is written
        (the moves wait for the next drain). While Kafka does not answer (see the module
        docstring) the moves stay queued."""
        try:
            if not self._flight.land(wait=wait) or not self._writable(owned):
                return False
            wrote = self._drain_waiting(owned, commit_point)
            queue = self._queue
            while queue and not self._transaction.unwritten:
                pending = queue.popleft()
                self._taken += 1
                pending.submitted = self._taken
                where = pending.where
                if pending.move and not self._room(where, commit_point(where), pending.offset):
                    if pending.given_up:  # not to wait for room in the next assignment
                        self._resolve(pending, False)
                        continue
                    self._waiting.hold(pending)
                    continue
                wrote |= self._write(pending, owned)
            if wrote:
                self._txn.producer.poll(0)  # delivery reports: once a drain, not once a move
        finally:
            self._tell()
        return wrote

    def _drain_waiting(
        self, owned: Callable[[Where], bool], commit_point: Callable[[Where], int]
    ) -> bool:
        """Write the waiting moves that have room now; returns whether any was written."""

        def goes(where: Where, pending: Pending) -> bool:
            # Not after Kafka stopped answering during this drain (MoveTransaction._rewrite).
            return pending.given_up or (
                not self._transaction.unwritten
                and self._room(where, commit_point(where), pending.offset)
            )

        wrote = False
        for pending in self._waiting.ready(goes):
            wrote |= self._write(pending, owned)  # perhaps ahead of older moves of its keys
        return wrote

    def _writable(self, owned: Callable[[Where], bool]) -> bool:
        """Whether moves may be written now: not while a commit Kafka has not confirmed goes
        on; before the first, the transactional id is registered, and the moves of an aborted
        transaction are written again. False while Kafka does not answer."""
        if self._txn.committing:
            return False
        if not (self._queue or self._waiting or self._transaction.unwritten):
            return True
        try:
            if not self.initialized:
                self.init()
        except KafkaUnavailableError as exc:
            self._errors.warning("init", "moves wait: %s", exc)
            return False
        return self._transaction.resume(owned)

    def _room(self, where: Where, commit_point: int, offset: int) -> bool:
        """Whether a move of ``offset`` may be written now. The job at the commit point always
        may: the commit point then passes it, which is what makes room for the others."""
        moved = self.moved.get(where)
        if not moved or len(moved) < self._max_moved or offset <= commit_point:
            return True
        for stale in [o for o in moved if o < commit_point]:
            moved.discard(stale)
        return len(moved) < self._max_moved

    def _write(self, pending: Pending, owned: Callable[[Where], bool]) -> bool:
        """Write ``pending`` if its assignment still owns its partition (see :meth:`submit`)."""
        state = pending.state
        if pending.elsewhere and not owned(pending.where):
            pending.where = next(filter(owned, pending.elsewhere), pending.where)
        if not owned(pending.where) or (state is not None and state.released):
            self._resolve(pending, False)
            return False
        self._transaction.write(pending, owned)
        if pending.move:
            self.moved.setdefault(pending.where, set()).add(pending.offset)
        if self._waiting.holds_keys:  # rare: moves wait for room above a long job
            self._waiting.supersede(pending)
        self._resolve(pending, True)
        return True

    def touched(self) -> list[Where]:
        """Partitions with moves in the open transaction: their offsets must be sent with it."""
        return self._transaction.touched()

    def stranded(self) -> set[Where]:
        """Partitions with moves in no open transaction, which no commit may cover (see
        :meth:`.movetxn.MoveTransaction.stranded`)."""
        return self._transaction.stranded()

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
        among them); returns whether it committed (see :meth:`.movetxn.MoveTransaction.commit`).
        """
        self._flight.land()
        if not self._transaction.commit(offsets, group_metadata, owned):
            return False
        self._committed(offsets)
        return True

    def commit_async(
        self,
        offsets: list[TopicPartition],
        group_metadata: Any,
        owned: Callable[[Where], bool],
        then: Callable[[bool, float], object],
    ) -> None:
        """:meth:`commit` on a helper thread; ``then(committed, ended_at)`` runs on the consumer
        thread when it lands (:meth:`land`, or the first drain after it ended)."""
        self._flight.land()
        transaction = self._transaction
        resumed = transaction.resumed

        def landed(outcome: Outcome) -> None:
            committed = transaction.settle(resumed, outcome, owned)
            if committed:
                self._committed(offsets)
            then(committed, self._flight.ended_at)

        self._flight.start(transaction.call(offsets, group_metadata), landed)

    def land(self) -> None:
        """Wait for the commit in flight, if any, and take its outcome back (a transaction
        still open then holds the moves of one Kafka aborted, or one it has not confirmed)."""
        self._flight.land()

    def _committed(self, offsets: list[TopicPartition]) -> None:
        for tp in offsets:
            self._prune((tp.topic, tp.partition), tp.offset)

    def forget(self, wheres: Iterable[Where]) -> None:
        """Partitions given up: drop what we know of their moves. Moves of theirs still in the
        open transaction (a lost partition, whose offsets cannot be committed) are taken out
        by writing the transaction again without them."""
        gone = set(wheres)
        self._flight.land()
        try:
            for where in gone:
                self.moved.pop(where, None)
                for pending in self._waiting.drop(where):
                    self._resolve(pending, False)
            # Moves submitted for the assignment that ends here and not drained yet: a drain
            # after the partition came back would write them into the next one. The loop may
            # append meanwhile (a late move of this assignment is refused by the drain, its
            # assignment being released by now, see _write): the moves kept go back in front
            # of those, in their order (two moves may settle one idempotency key).
            queue = self._queue
            taken = [queue.popleft() for _ in range(len(queue))]
            kept = []
            for pending in taken:
                if pending.where in gone or not gone.isdisjoint(pending.elsewhere):
                    self._resolve(pending, False)
                else:
                    kept.append(pending)
            queue.extendleft(reversed(kept))
        finally:
            self._tell()
        self._transaction.forget(gone)

    def close(self) -> None:
        try:
            self._flight.close()
        finally:
            self._txn.close(5.0)

    # -- internals -----------------------------------------------------------------------------

    def _prune(self, where: Where, committed: int) -> None:
        moved = self.moved.get(where)
        if moved:
            for offset in [o for o in moved if o < committed]:
                moved.discard(offset)

    def _drop_moved(self, where: Where) -> None:
        """``where``'s moves left the transaction, not ours any more: forget its moved offsets."""
        self.moved.pop(where, None)

    def _resolve(self, pending: Pending, done: bool) -> None:
        """``pending.done(done)`` on the loop, with the others of this drain (:meth:`_tell`)."""
        self._resolved.append((pending.done, done))

    def _tell(self) -> None:
        """Hand the loop what was resolved since the last time, in one callback."""
        if not self._resolved:
            return
        resolved, self._resolved = self._resolved, []
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is exiting
            self._loop.call_soon_threadsafe(_run_all, resolved)


def _run_all(resolved: list[tuple[Done, bool]]) -> None:
    """Run the loop's side of resolved moves, in order; one failing does not stop the rest."""
    for done, ok in resolved:
        try:
            done(ok)
        except Exception:
            _log.exception("a callback of a move failed")
