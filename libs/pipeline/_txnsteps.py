"""One transaction's steps (begin, commit, abort) and what librdkafka's errors make of them.

:class:`TransactionSteps`, the base of :class:`~pipeline._transactions.Transactions`, turns
librdkafka's transactional errors into the project's, by the flags librdkafka sets on each
:class:`~confluent_kafka.KafkaError`:

- ``fatal()``: the producer can do nothing more, typically because a newer producer of the
  same ``transactional.id`` fenced it: :class:`TransactionFencedError`. The caller stops; what
  it left open is aborted by the broker. A producer whose ``transactional.id`` is its process's
  alone (the worker's: a zombie is fenced by its group's generation, KIP-447, which is an
  abort, not a fatal error) is *renewed* instead when its owner says how (``renew``): Kafka
  fenced it for a transaction it aborted on timeout, or lost track of it in a broker crash
  (``INVALID_TXN_STATE``). A new producer takes its place, registered before its first
  transaction (which aborts what the old one left open), and :class:`TransactionAbortedError`
  says to write it again. A fatal error while registering is raised as above: renewing again
  would not cure it (a transactional id the cluster does not allow). Without ``renew``, a
  fatal error of a registered producer that is not a fence raises
  :class:`TransactionProducerFailedError`, a :class:`TransactionError` (nothing committed):
  its owner writes the transaction again with a new producer (the scheduler's next term).
- ``txn_requires_abort()``: the open transaction must be aborted (a rebalance made the group
  generation sent with the offsets stale, a message failed...). It is aborted here, then
  :class:`TransactionAbortedError` says that nothing of it is visible: write it again.
  :meth:`~._transactions.Transactions.run` and :meth:`~._transactions.Transactions.rewrite` do
  that themselves, a bounded number of times.
- ``retriable()``: the same step is called again after a short pause, a bounded number of
  times; after the last, the transaction is aborted and :class:`KafkaUnavailableError` raised
  (a commit may stay unconfirmed instead: see below).
- anything else (a programming or configuration error): aborted, :class:`TransactionError`.

``produce()`` is not a transactional call: it gives librdkafka's bare code, without those flags
(see :func:`produce_error`), and each refusal of it is read as the flags it stands for.

While Kafka does not answer, each call waits at most ``timeout_s``
(:data:`~._txnproducer.STEP_TIMEOUT_S` for the long-running services: a healthy step takes
milliseconds) and a step is tried ``attempts`` times, with ``sleep`` between attempts.
librdkafka goes on in the background with a commit or an abort whose call timed out, and refuses
every other transactional call (``_CONFLICT``) until that one is called again and ends. So a
commit given up on is *unconfirmed*, not failed (:attr:`TransactionSteps.committing`, with
:class:`KafkaUnavailableError`): it may yet be committed, and :meth:`TransactionSteps.commit`
(which sends no offsets again) learns its outcome. An abort given up on
(:attr:`TransactionSteps.aborting`) is finished by the next :meth:`TransactionSteps.begin` before
it opens a transaction (so is an unconfirmed commit, whose outcome is then only logged); while
Kafka still does not answer, that raises :class:`KafkaUnavailableError` and nothing is open.

``send_offsets_to_transaction`` is given up on when it has not returned after twice its
timeout (librdkafka can block in it for good after a broker restart, see :mod:`._boundedcall`):
the producer is renewed as after a fatal error, or :class:`TransactionProducerFailedError`.

Methods are called from one thread (the one that owns the producer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from ._boundedcall import BoundedCalls, CallOutlivedError
from ._errors import (
    KafkaUnavailableError,
    NotAuthorizedError,
    TransactionAbortedError,
    TransactionError,
    TransactionFencedError,
    TransactionProducerFailedError,
)
from ._txnproducer import TransactionalProducer

__all__ = ["TransactionSteps"]

_log = logging.getLogger("pipeline.transactions")

_FENCED = frozenset(
    {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
)
_COMMIT = "commit"
_ABORT = "abort"


class TransactionSteps:
    """Begin, send offsets, commit and abort one producer's transactions; retry, abort and
    fence as the module says.

    ``name`` says whose producer it is in messages ("the scheduler's transactional producer");
    ``when_fenced`` tells the operator what being fenced means for this caller and what to do.
    """

    def __init__(
        self,
        producer: TransactionalProducer,
        *,
        name: str,
        when_fenced: str = "a newer producer with the same transactional id took over",
        timeout_s: float = 30.0,
        attempts: int = 5,
        units: int = 3,
        pause_s: float = 0.1,
        sleep: Callable[[float], None] = time.sleep,
        renew: Callable[[], TransactionalProducer] | None = None,
        acl: tuple[str, str | None, str | None] | None = None,
    ) -> None:
        self.producer = producer
        self._acl = acl
        """(transactional id, Kafka user, role), named when Kafka's ACLs refuse the id."""
        self._renew = renew
        self._registered = False
        """Whether :attr:`producer`'s transactional id is registered: a renewed producer's is
        registered by :meth:`begin`."""
        self.name = name
        self._when_fenced = when_fenced
        self._timeout = timeout_s
        self._attempts = attempts
        self._units = units  # the tries of a unit in Transactions.run and .rewrite
        self._pause = pause_s
        self._sleep = sleep
        self._open = False
        self.opened_at = 0.0
        """When the open transaction began (``time.monotonic``). Kafka aborts one open longer
        than ``transaction.timeout.ms``, and fences its producer for good."""
        self._unfinished: str | None = None  # commit or abort: see the module docstring
        self._bounded = BoundedCalls("pipeline-txn-offsets")
        """Where ``send_offsets_to_transaction`` runs, to be given up on (:meth:`_send_offsets`)."""
        self._renewals = 0

    @property
    def renewals(self) -> int:
        """How many times a fatal error replaced the producer (see the module docstring)."""
        return self._renewals

    @property
    def open(self) -> bool:
        """Whether a transaction is open (begun, neither committed nor aborted); an
        unconfirmed commit (:attr:`committing`) keeps it open."""
        return self._open

    @property
    def committing(self) -> bool:
        """Whether a commit Kafka did not confirm goes on (:meth:`commit` learns its outcome)."""
        return self._unfinished == _COMMIT

    @property
    def aborting(self) -> bool:
        """Whether an abort Kafka did not confirm goes on (:meth:`begin` finishes it)."""
        return self._unfinished == _ABORT

    def begin(self) -> None:
        """Open a transaction unless one is open. An abort Kafka left unconfirmed is finished
        first (:class:`KafkaUnavailableError` while Kafka still does not answer: nothing is
        open then), and so is a commit left unconfirmed, whose outcome is only logged."""
        if self._unfinished == _ABORT:
            self._finish_abort()
        elif self._unfinished == _COMMIT:
            self._finish_commit()
        if self._renewals and not self._registered:
            self.register()
        if not self._open:
            self._step("begin a transaction", self.producer.begin_transaction)
            self._open = True
            self.opened_at = time.monotonic()

    def commit(self, offsets: Sequence[TopicPartition] = (), group_metadata: Any = None) -> None:
        """Commit the open transaction with the consumed ``offsets`` of the consumer whose
        ``consumer_group_metadata()`` is ``group_metadata``; a no-op when none is open.

        When Kafka does not confirm the commit in ``attempts`` calls it goes on in the
        background: :class:`KafkaUnavailableError` is raised and :attr:`committing` is set. The
        next call ends that commit, sending no offsets (those sent before are the ones it
        commits): it returns once Kafka committed it, raises :class:`TransactionAbortedError`
        if Kafka aborted it instead, and :class:`KafkaUnavailableError` again while Kafka still
        does not answer."""
        if not self._open:
            return
        if offsets and self._unfinished != _COMMIT:
            self._step(
                "send the consumed offsets", self._send_offsets, list(offsets), group_metadata
            )
        self._step(
            "commit a transaction", self.producer.commit_transaction, self._timeout, resumable=True
        )
        self._open = False
        self._unfinished = None

    def abort(self) -> None:
        """Abort the open transaction, if any. Best effort: a transaction whose abort fails
        is aborted by the broker after ``transaction.timeout.ms``. An abort Kafka does not
        confirm in time goes on in the background (:attr:`aborting`); a commit Kafka has not
        confirmed (:attr:`committing`) cannot be aborted: Kafka commits it or aborts it."""
        if not self._open:
            return
        exc = self._abort_calls()
        if exc is None:
            self._open = False
            self._unfinished = None
            return
        error: KafkaError = exc.args[0]
        conflict = error.code() == KafkaError._CONFLICT
        if conflict and self._unfinished == _COMMIT:
            _log.info(
                "not aborted: Kafka goes on with the commit it has not confirmed",
                extra={"producer": self.name},
            )
            return
        self._open = False
        retriable = error.retriable() and not error.fatal() and not conflict
        self._unfinished = _ABORT if retriable else None
        _log.warning(
            "aborting a transaction failed: %s", error.str(), extra={"producer": self.name}
        )
        if error.fatal():
            self._renewed(error.str())  # whose registration aborts what the old one left open

    def register(self, timeout_s: float | None = None) -> None:
        """Register the transactional id, fencing every older producer of it (what they left
        open is aborted)."""
        timeout = self._timeout if timeout_s is None else timeout_s
        self._step("register the transactional id", self.producer.init_transactions, timeout)
        self._registered = True

    # -- internals -----------------------------------------------------------------------------

    def _send_offsets(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """``send_offsets_to_transaction``, given up on at twice its timeout: librdkafka can
        block in it for good (see :mod:`._boundedcall`). The producer is stuck then, its
        transaction with it: it is renewed as after a fatal error (the new one's registration
        aborts that transaction), or the owner is told to write it with a new one."""
        deadline = 2 * self._timeout
        producer = self.producer
        try:
            self._bounded.call(
                deadline, producer.send_offsets_to_transaction, offsets, group_metadata,
                self._timeout,
            )  # fmt: skip
        except CallOutlivedError:
            reason = (
                f"send_offsets_to_transaction did not return in {deadline:g}s, twice its "
                "timeout: librdkafka's call is left on a thread of its own"
            )
            self._open = False
            self._unfinished = None
            if self._renewed(reason):
                raise TransactionAbortedError(
                    f"{self.name} stopped answering while trying to send the consumed offsets "
                    f"({reason}); a new producer takes its place. Nothing of the open "
                    "transaction was committed"
                ) from None
            raise TransactionProducerFailedError(
                f"{self.name} stopped answering while trying to send the consumed offsets "
                f"({reason}); nothing of the open transaction was committed: a new producer "
                "must write it again"
            ) from None

    def _abort_calls(self) -> KafkaException | None:
        """Call ``abort_transaction`` up to ``attempts`` times while it fails retriably; the
        last error, or None once it succeeded."""
        for attempt in range(1, self._attempts + 1):
            try:
                self.producer.abort_transaction(self._timeout)
                return None
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                again = error.retriable() and not error.fatal()
                # _CONFLICT: librdkafka goes on with another call (a commit), asking again
                # changes nothing.
                if again and error.code() != KafkaError._CONFLICT and attempt < self._attempts:
                    self._sleep(self._pause * attempt)
                    continue
                return exc
        raise AssertionError("unreachable: the last attempt returns")

    def _finish_abort(self) -> None:
        """End the abort Kafka left unconfirmed, or raise :class:`KafkaUnavailableError`."""
        exc = self._abort_calls()
        if exc is None:
            self._unfinished = None
            return
        error: KafkaError = exc.args[0]
        if error.retriable() and not error.fatal():
            raise KafkaUnavailableError(
                f"Kafka did not let {self.name} finish aborting a transaction in "
                f"{self._attempts} attempts ({error.str()}); nothing of it was committed, and "
                "nothing new is written until it is finished. Is the cluster up and reachable?"
            ) from exc
        self._unfinished = None
        if error.fatal() or error.code() in _FENCED:
            self._failed(exc, "finish aborting a transaction", self._attempts)
        # Anything else: librdkafka holds no abort to finish any more; begin as usual.
        _log.info("finishing an abort: %s", error.str(), extra={"producer": self.name})

    def _finish_commit(self) -> None:
        """End the unconfirmed commit of a caller that begins anew; only log its outcome."""
        outcome = "committed after all: its records are in Kafka"
        try:
            self.commit()
        except TransactionAbortedError as exc:
            outcome = f"aborted by Kafka: nothing of it is visible ({exc})"
        _log.warning("an unconfirmed commit was %s", outcome, extra={"producer": self.name})

    def _renewed(self, reason: str) -> bool:
        """Put a new producer in the place of a registered one that failed for good, when the
        owner said how (``renew``, see the module docstring); whether it did. The old one is
        dropped (librdkafka discards what it still held)."""
        if self._renew is None or not self._registered:
            return False
        self.producer = self._renew()
        self._registered = False
        self._renewals += 1
        _log.warning(
            "a new transactional producer replaces one that failed for good (%s)",
            reason,
            extra={"producer": self.name},
        )
        return True

    def _failed_for_good(self, exc: KafkaException, doing: str) -> NoReturn:
        """A fatal error (or a fence) while trying to ``doing``: see the module docstring."""
        error: KafkaError = exc.args[0]
        reason = error.str()
        self._open = False  # nothing can be aborted any more: the broker aborts it
        self._unfinished = None
        if self._renewed(reason):
            raise TransactionAbortedError(
                f"{self.name} failed for good while trying to {doing} ({reason}); a new "
                "producer takes its place. Nothing of the open transaction was committed"
            ) from exc
        if error.code() in _FENCED or "fenced" in reason.lower():
            message = f"{self.name} was fenced while trying to {doing}: {self._when_fenced}"
            raise TransactionFencedError(message, reason) from exc
        if self._registered:
            raise TransactionProducerFailedError(
                f"{self.name} failed for good while trying to {doing} ({reason}); nothing "
                "of the open transaction was committed: a new producer must write it again"
            ) from exc
        message = (
            f"{self.name} failed for good while trying to {doing} ({reason}); "
            "restart the process. Nothing of the open transaction was committed"
        )
        raise TransactionFencedError(message, reason) from exc

    def _step(
        self, doing: str, method: Callable[..., None], *args: Any, resumable: bool = False
    ) -> None:
        for attempt in range(1, self._attempts + 1):
            try:
                method(*args)
                return
            except KafkaException as exc:
                self._failed(exc, doing, attempt, resumable=resumable)

    def _failed(
        self, exc: KafkaException, doing: str, attempt: int, *, resumable: bool = False
    ) -> None:
        """Classify one failed step: return to retry it, raise otherwise. ``resumable``: the
        commit, which librdkafka goes on with after a call that timed out."""
        error: KafkaError = exc.args[0]
        reason = error.str()
        if error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            # Not a fence, and no restart or new producer cures it: the ACLs must change.
            self._open = False
            self._unfinished = None
            txn_id, user, role = self._acl or ("of this producer", None, None)
            raise NotAuthorizedError("TRANSACTIONAL_ID", txn_id, "WRITE", user, role) from exc
        if error.fatal() or (error.code() in _FENCED and not error.txn_requires_abort()):
            self._failed_for_good(exc, doing)
        if error.txn_requires_abort():
            self._unfinished = None  # a commit that went on has ended: Kafka wants an abort
            self.abort()
            raise TransactionAbortedError(
                f"Kafka aborted the transaction while {self.name} tried to {doing}: {reason}"
            ) from exc
        if error.retriable():
            if attempt < self._attempts:
                _log.info("retrying to %s: %s", doing, reason, extra={"producer": self.name})
                self._sleep(self._pause * attempt)
                return
            if resumable:
                # librdkafka goes on with the commit, and refuses the abort meanwhile.
                self._unfinished = _COMMIT
                self.abort()
                if self._unfinished == _COMMIT:
                    raise KafkaUnavailableError(
                        f"Kafka did not confirm {self.name}'s commit in {attempt} attempts "
                        f"({reason}); it goes on in the background and may yet be committed: "
                        "commit again to learn its outcome. Is the cluster up and reachable?"
                    ) from exc
            else:
                self.abort()
            raise KafkaUnavailableError(
                f"Kafka did not let {self.name} {doing} in {attempt} attempts ({reason}); "
                "nothing of the open transaction was committed. Is the cluster up and reachable?"
            ) from exc
        self._unfinished = None
        self.abort()
        raise TransactionError(
            f"Kafka refused to let {self.name} {doing}: {reason} ({error.name()}); "
            "nothing of the open transaction was committed"
        ) from exc


def produce_error(exc: KafkaException) -> KafkaException:
    """``exc``, a refusal of ``produce()`` inside an open transaction, with the flags of the
    error it stands for: ``produce()`` gives librdkafka's bare code, where the transactional
    calls give an error flagged for what to do. A producer that failed for good (fenced in the
    background, say) refuses with ``_FATAL``: fatal. One whose open transaction must be aborted
    (one of its messages failed) refuses with ``_STATE``: abort (a transaction is open: the
    caller began it, so no other state can be meant). Anything else as it came."""
    error: KafkaError = exc.args[0]
    code = error.code()
    if code == KafkaError._FATAL and not error.fatal():
        flagged = KafkaError(code, error.str(), fatal=True)
    elif code == KafkaError._STATE and not error.txn_requires_abort():
        flagged = KafkaError(code, error.str(), txn_requires_abort=True)
    else:
        return exc
    read = KafkaException(flagged)
    read.__cause__ = exc
    return read
