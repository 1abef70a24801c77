"""What the application needs from a producer (:class:`Transport`), and how it asks one why
jobs failed: Kafka refused its credentials (:func:`refusal_of`), or the producer failed for good
(:func:`fatal_of`). :class:`pipeline._producer.KafkaTransport` is the Kafka one;
:class:`pipeline.testing.InMemoryTransport` the in-memory one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from confluent_kafka import KafkaError

from ._brokerhealth import DeliveryCallback

if TYPE_CHECKING:
    from ._errors import KafkaAuthenticationError

__all__ = [
    "UNREACHABLE_CODES",
    "DeliveryCallback",
    "Transport",
    "describe_fatal",
    "fatal_of",
    "refusal_of",
]

# librdkafka error codes that mean "Kafka could not be reached", as opposed to "Kafka said no".
UNREACHABLE_CODES = frozenset(
    {
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


class Transport(Protocol):
    """What the application needs from a producer; the in-memory broker implements it too.

    A transport may also have ``purge()``: drop what is still queued, each with a failed
    delivery callback, so that the exit report names the jobs it loses; ``refused()``: the
    :class:`KafkaAuthenticationError` to raise once Kafka refused it (see :func:`refusal_of`);
    and ``failed_for_good()``: what :func:`fatal_of` asks.
    """

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None: ...

    def poll(self, timeout: float = 0) -> int: ...

    def flush(self, timeout: float) -> int: ...

    def close(self) -> None: ...


def refusal_of(transport: Transport) -> KafkaAuthenticationError | None:
    """The error to raise when Kafka refused ``transport``'s credentials (None: it did not)."""
    refused = getattr(transport, "refused", None)
    return refused() if refused is not None else None


def fatal_of(transport: Transport) -> str | None:
    """The fatal error of the failed producer whose delivery reports this thread serves now,
    for the delivery callbacks of ``transport`` (None: a working producer's reports)."""
    failed = getattr(transport, "failed_for_good", None)
    return failed() if failed is not None else None


def describe_fatal(error: KafkaError) -> str:
    """A fatal error as its messages name it: its code and librdkafka's words."""
    return f"{error.name()}: {error.str()}"
