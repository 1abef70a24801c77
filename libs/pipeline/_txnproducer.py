"""The transactional producer as :mod:`._transactions` sees it: the calls it makes, the types
of what it writes, and how long it lets a call wait while Kafka does not answer."""

from __future__ import annotations

from typing import Any, Protocol

from confluent_kafka import TopicPartition

from ._errors import PipelineError

__all__ = [
    "STEP_TIMEOUT_S",
    "Headers",
    "Message",
    "MessageTooLargeError",
    "TransactionalProducer",
    "request_timeout_ms",
]

Headers = list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None
Message = tuple[str, bytes | None, bytes | None, Headers, int | None]
"""What :meth:`~._transactions.Transactions.produce_all` writes: (topic, value, key, headers,
partition)."""

STEP_TIMEOUT_S = 5.0
"""The longest one call of a long-running service's transaction waits while Kafka does not
answer (the scheduler leader's, the worker's moves): a healthy step takes milliseconds, and the
thread that makes it has other work (a group to serve, a consumer to poll)."""


def request_timeout_ms(transaction_timeout_ms: int, timeout_s: float = STEP_TIMEOUT_S) -> int:
    """``socket.timeout.ms`` for a transactional producer whose calls are to wait at most
    ``timeout_s``. ``send_offsets_to_transaction()`` returns only once its request to the
    transaction coordinator is answered or timed out, whatever the call's own timeout, and with
    a ``transactional.id`` librdkafka's default for that is ``transaction.timeout.ms`` - 100
    (it refuses more than + 100): 10 s for the worker's moves, 60 s for the scheduler's."""
    return max(10, min(int(timeout_s * 1000), transaction_timeout_ms + 100))


class MessageTooLargeError(PipelineError):
    """The producer refused a message as larger than its ``message.max.bytes`` before taking
    it; the open transaction goes on without it (see
    :meth:`~._transactions.Transactions.produce`)."""


class TransactionalProducer(Protocol):
    """The part of ``confluent_kafka.Producer`` the loop uses (a fake implements it in tests)."""

    def init_transactions(self, timeout: float = -1, /) -> None: ...

    def begin_transaction(self) -> None: ...

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        *,
        headers: Headers = None,
    ) -> None: ...

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1, /
    ) -> None: ...

    def commit_transaction(self, timeout: float = -1, /) -> None: ...

    def abort_transaction(self, timeout: float = -1, /) -> None: ...

    def poll(self, timeout: float = -1, /) -> int: ...

    def flush(self, timeout: float = -1, /) -> int: ...
