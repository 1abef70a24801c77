"""The leader's transactional producer: every release, move and fire is part of a transaction.

The ``transactional.id`` is the same for every scheduler process of a namespace, so a new
leader's ``init_transactions()`` fences the previous one: a leader that was thought dead (a long
pause, a partition) can no longer commit. librdkafka's errors fall in three kinds, each with its
own exception: retriable (retried here), abortable (:class:`TransactionAbortedError`: the caller
rewinds to the committed state) and fatal, fenced included (:class:`LeadershipFencedError`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from pipeline._brokerhealth import BrokerHealth
from pipeline._producer import producer_config
from pipeline._settings import Settings

from ._duequeue import Headers

_log = logging.getLogger("pipeline.scheduler.txn")


class TransactionAbortedError(Exception):
    """The open transaction was aborted; nothing of it is visible. Rewind and start again."""


class LeadershipFencedError(Exception):
    """Another scheduler took over (or the producer failed for good): stop at once."""


def transactional_id(settings: Settings) -> str:
    return settings.scheduler.transactional_id or f"{settings.namespace}.scheduler"


class Transactions:
    """A transactional producer that opens a transaction on the first write of a batch."""

    def __init__(self, settings: Settings, timeout_s: float = 30.0) -> None:
        conf: dict[str, Any] = producer_config(settings)
        conf.update(
            {
                "transactional.id": transactional_id(settings),
                "linger.ms": 1,
                "transaction.timeout.ms": 60_000,
                **BrokerHealth.of(settings.bootstrap_servers).callbacks("scheduler producer"),
            }
        )
        conf.update(settings.kafka)
        self._producer = Producer(conf)
        self._timeout = timeout_s
        self.open = False

    def init(self) -> None:
        """Fence every older producer of this ``transactional.id`` (aborting what it left open)."""
        self._call(self._producer.init_transactions, self._timeout)

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Headers) -> None:
        if not self.open:
            self._call(self._producer.begin_transaction)
            self.open = True
        while True:
            try:
                self._producer.produce(topic, value, key, headers=headers)
                return
            except BufferError:
                self._producer.poll(0.01)
            except KafkaException as exc:
                self._raise(exc)

    def commit(self, offsets: Sequence[TopicPartition], group_metadata: Any) -> None:
        """Commit the open transaction with the consumed ``offsets`` (no-op when none is open)."""
        if not self.open:
            return
        if offsets:
            self._call(
                self._producer.send_offsets_to_transaction,
                list(offsets),
                group_metadata,
                self._timeout,
            )
        self._call(self._producer.commit_transaction, self._timeout)
        self.open = False

    def abort(self) -> None:
        if not self.open:
            return
        self.open = False
        try:
            self._producer.abort_transaction(self._timeout)
        except KafkaException as exc:
            _log.warning("aborting the transaction failed", extra={"error": exc.args[0].str()})

    def close(self) -> None:
        self.abort()
        self._producer.flush(1.0)

    def _call(self, method: Any, *args: Any) -> None:
        for attempt in range(5):
            try:
                method(*args)
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if error.retriable() and not error.txn_requires_abort() and attempt < 4:
                    _log.info("retrying a transaction step", extra={"error": error.str()})
                    time.sleep(0.1 * (attempt + 1))
                    continue
                self._raise(exc)

    def _raise(self, exc: KafkaException) -> None:
        error: KafkaError = exc.args[0]
        if error.txn_requires_abort():
            self.abort()
            raise TransactionAbortedError(error.str()) from exc
        raise LeadershipFencedError(error.str()) from exc
