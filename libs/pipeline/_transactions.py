"""One Kafka transaction loop for every transactional writer of the project.

:class:`Transactions` wraps a transactional ``confluent_kafka.Producer`` (wrapped, not
subclassed). How each of librdkafka's transactional errors becomes the project's (fenced,
aborted, unavailable, refused), and what happens to a commit or an abort Kafka did not confirm,
is said in :mod:`pipeline._txnsteps`, whose :class:`~pipeline._txnsteps.TransactionSteps`
begins, commits and aborts.

Two ways to use it:

- **A unit at a time** (dead-letter replay): ``txn.run(write, offsets, group_metadata)``
  begins, calls ``write(txn)``, which calls ``txn.produce(...)``, sends the offsets and
  commits; after an abort it runs the whole unit again, so ``write`` must produce the same
  records each time it is called.
- **An open transaction fed over time** (the scheduler's releases, the worker's moves and its
  retry relay): ``txn.produce(...)`` opens a transaction on the first write;
  ``txn.commit(offsets, group_metadata)`` sends the consumed offsets with the consumer's
  ``consumer_group_metadata()`` and commits (a no-op when nothing is open). On
  :class:`TransactionAbortedError` the caller either rewinds to what Kafka committed (the
  scheduler, the relay: nothing of the aborted transaction is kept) or, when it still holds
  what the transaction contained, writes it again into a new open transaction with
  ``txn.rewrite(write)``. The worker's moves do the latter::

      try:
          txn.produce(record.topic, record.value, record.key, headers=record.headers)
      except TransactionAbortedError:
          txn.rewrite(produce_moves_still_owned_and_this_one)   # left open, not committed
      ...
      try:
          txn.commit(offsets, consumer.consumer_group_metadata())
      except TransactionAbortedError:      # the group rebalanced: its generation is stale
          txn.rewrite(produce_moves_still_owned)
          return False                     # poll (the rebalance completes), commit later
      except TransactionFencedError:       # a zombie: stop the worker
          raise

Methods are called from one thread (the one that owns the producer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from ._errors import TransactionAbortedError
from ._txnproducer import (
    STEP_TIMEOUT_S,
    Headers,
    Message,
    MessageTooLargeError,
    TransactionalProducer,
    request_timeout_ms,
)
from ._txnsteps import TransactionSteps, produce_error

__all__ = [
    "STEP_TIMEOUT_S",
    "Headers",
    "Message",
    "MessageTooLargeError",
    "Tally",
    "TransactionalProducer",
    "Transactions",
    "request_timeout_ms",
]

_log = logging.getLogger("pipeline.transactions")


class Transactions(TransactionSteps):
    """Begin, produce, send offsets, commit; retry, abort and fence as :mod:`pipeline._txnsteps`
    says. Constructed as :class:`~pipeline._txnsteps.TransactionSteps` is."""

    def init(self, timeout_s: float | None = None) -> None:
        """Register the transactional id, fencing every older producer of it (what they left
        open is aborted). Called once, before anything else."""
        self.register(timeout_s)

    def init_until(self, stopped: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Register the transactional id as :meth:`init` does, but wait out an outage: a
        retriable error (Kafka does not answer) is logged at DEBUG and the registration tried
        again until it succeeds or ``stopped()`` says to give up. For a process starting while
        Kafka is down, which reports the outage elsewhere (its health line). Any other error
        raises as in :meth:`init`. True: registered; False: stopped first."""
        timeout = self._timeout if timeout_s is None else timeout_s
        while not stopped():
            try:
                self.producer.init_transactions(timeout)
                self._registered = True
                return True
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not error.retriable():
                    self._failed(exc, "register the transactional id", self._attempts)
                    raise  # _failed raises for every error that is not retriable
                _log.debug("%s: registering the transactional id: %s", self.name, error.str())
        return False

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        *,
        headers: Headers = None,
        partition: int | None = None,
        too_large_raises: bool = False,
    ) -> None:
        """Write one message into the open transaction (opening one if none is).

        ``too_large_raises``: a message the producer refuses as larger than its
        ``message.max.bytes`` raises :class:`MessageTooLargeError` and leaves the transaction
        open, for the caller to write something else instead; otherwise that refusal aborts the
        transaction, as any other does.
        """
        self.begin()
        args = (topic, value, key) if partition is None else (topic, value, key, partition)
        for attempt in range(1, self._attempts + 1):
            try:
                while True:
                    try:
                        self.producer.produce(*args, headers=headers)
                        return
                    except BufferError:  # the local queue is full: deliver some first
                        self.producer.poll(0.01)
            except KafkaException as exc:
                if too_large_raises and exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise MessageTooLargeError(
                        f"a {len(value or b'')}-byte message for {topic} is larger than "
                        f"{self.name} sends (message.max.bytes)"
                    ) from exc
                self._failed(produce_error(exc), f"write to {topic}", attempt)

    def produce_all(self, messages: Iterable[Message]) -> None:
        """:meth:`produce` each of ``messages``, ``(topic, value, key, headers, partition)``
        (``partition`` None: the partitioner picks), opening the transaction once for all of
        them. A message the producer refuses goes through :meth:`produce`, with its retries."""
        self.begin()
        produce = self.producer.produce
        for topic, value, key, headers, partition in messages:
            try:
                if partition is None:
                    produce(topic, value, key, headers=headers)
                else:
                    produce(topic, value, key, partition, headers=headers)
            except (BufferError, KafkaException):
                self.produce(topic, value, key, headers=headers, partition=partition)

    def run(
        self,
        write: Callable[[Transactions], None],
        offsets: Sequence[TopicPartition] = (),
        group_metadata: Any = None,
    ) -> None:
        """One unit in one transaction: begin, ``write(self)``, send ``offsets``, commit.

        After an abort the whole unit runs again in a new transaction, up to ``units`` times.
        A transaction left open by :meth:`produce` is committed with it.
        """
        self._units_of(write, lambda: self.commit(offsets, group_metadata))

    def rewrite(self, write: Callable[[Transactions], None]) -> None:
        """Abort the open transaction and ``write(self)`` into a new one, which stays open
        (for callers that still hold what the aborted one contained)."""
        self.abort()
        self._units_of(write, lambda: None)

    def close(self, timeout_s: float = 5.0) -> None:
        """Abort what is open and deliver what librdkafka still holds (nothing, for a fenced
        producer: its flush raises the fatal error again, which is logged, not raised)."""
        self.abort()
        try:
            self.producer.flush(timeout_s)
        except KafkaException as exc:
            _log.info("closing %s: %s", self.name, exc.args[0].str())
        finally:
            self._bounded.close()

    def _units_of(self, write: Callable[[Transactions], None], end: Callable[[], None]) -> None:
        for unit in range(1, self._units + 1):
            try:
                self.begin()
                write(self)
                end()
                return
            except TransactionAbortedError as exc:
                if unit == self._units:
                    raise TransactionAbortedError(
                        f"Kafka aborted {unit} transactions in a row ({exc}); nothing of the "
                        f"last one is visible. Check the cluster's health and try again"
                    ) from exc
                _log.info(
                    "transaction aborted, writing it again: %s", exc, extra={"producer": self.name}
                )


class Tally:
    """Counts that belong to the open transaction: added to the metrics once it commits,
    dropped if it does not (what it wrote is written again, and counted then)."""

    def __init__(self) -> None:
        self._pending: list[Callable[[], object]] = []

    def add(self, count: Callable[..., object], *args: object) -> None:
        """``count(*args)`` once the open transaction commits."""
        self._pending.append(partial(count, *args))

    def committed(self) -> None:
        pending, self._pending = self._pending, []
        for count in pending:
            count()

    def drop(self) -> None:
        self._pending = []
