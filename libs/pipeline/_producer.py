"""A thin wrapper around confluent-kafka's Producer: safe defaults, created lazily, clear errors.

It is wrapped, not subclassed, so that the rest of the package depends on four methods only and
tests can swap it for an in-memory transport. A producer Kafka refuses (credentials, TLS:
:mod:`._authfailure`) raises :class:`KafkaAuthenticationError` from the next call, and its
waits stop at the refusal instead of at ``delivery.timeout.ms``.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from ._authfailure import authentication_error
from ._brokerhealth import BrokerHealth, DeliveryCallback
from ._errors import (
    KafkaAuthenticationError,
    KafkaUnavailableError,
    PayloadValidationError,
    PipelineError,
)
from ._settings import Settings

__all__ = [
    "UNREACHABLE_CODES",
    "DeliveryCallback",
    "KafkaTransport",
    "Transport",
    "fits_in_message",
    "message_max_bytes",
    "producer_config",
    "refusal_of",
    "too_large",
]

WAIT_STEP_S = 0.2
"""A flush waits in steps this long, to stop at a refusal of the credentials."""
_PROPAGATION_MAX_MS = 30_000
"""How long a producer waits for a topic it cannot find at most (librdkafka's default); half
the delivery timeout when that is shorter, so that such a job fails as a missing topic."""
LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``: the largest message a producer sends."""
REFUSAL_FRESH_S = 30.0
"""A refusal counts this long after librdkafka last reported it (it repeats it at each attempt,
every second or so): a producer whose credentials are accepted later works again."""

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
    delivery callback, so that the exit report names the jobs it loses; and ``refused()``:
    the :class:`KafkaAuthenticationError` to raise once Kafka refused it (see
    :func:`refusal_of`).
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


def message_max_bytes(settings: Settings) -> int:
    """The largest message (value, key and headers) the services' producers send: librdkafka
    refuses a larger one at once, which inside a transaction aborts it."""
    limit = settings.kafka.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX_BYTES)
    return int(limit)


RECORD_OVERHEAD = 512
"""Room left for what a record adds to its value, key and headers (lengths, timestamp), where a
record is written later than it is checked (the outbox, moves, dead letters)."""
PRODUCE_OVERHEAD = 36
"""What librdkafka itself adds to a record's value, key and headers when it checks
``message.max.bytes`` as it takes the record (measured: with no key nor headers, a value of
``message.max.bytes - 36`` bytes is taken, one byte more refused): the bound of an enqueue,
which produces at once, so that every job librdkafka would take is taken."""


def fits_in_message(max_bytes: int, value: bytes, key: bytes | None, headers_size: int = 0) -> bool:
    """Whether a record of ``value``, ``key`` and ``headers_size`` bytes of headers is one a
    producer sending at most ``max_bytes`` (:func:`message_max_bytes`) takes."""
    return len(value) + len(key or b"") + headers_size + RECORD_OVERHEAD <= max_bytes


def too_large(job_type: str, size: int, max_bytes: int) -> PayloadValidationError:
    """The error for a job of ``size`` bytes (value and key) that a producer sending at most
    ``max_bytes`` refuses."""
    return PayloadValidationError(
        job_type,
        f"the job takes {size:,} bytes and more as a Kafka message, more than the "
        f"{max_bytes:,} the producer sends (message.max.bytes): keep large data elsewhere and "
        "pass a reference",
    )


def producer_config(settings: Settings, *, bulk: bool = False) -> dict[str, Any]:
    """librdkafka options for producing jobs: idempotent, ``acks=all``, bounded delivery time.

    ``bulk``: the options of the producer that ``enqueue_many`` uses, which lingers
    ``producer.bulk_linger_ms`` to fill bigger batches.
    """
    conf: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        # The Java client's partitioner, so that a key maps to the same partition whichever
        # language produced the job (librdkafka's default hashes keys with CRC32 instead).
        "partitioner": "murmur2_random",
        # Unkeyed jobs go to a random partition each. librdkafka's default sticks to one
        # partition for a while, so a burst (all of it, from a producer still fetching
        # metadata) lands on one partition and one worker runs it while the others idle.
        "sticky.partitioning.linger.ms": 0,
        "linger.ms": settings.producer.bulk_linger_ms if bulk else settings.producer.linger_ms,
        "compression.type": settings.producer.compression,
        "delivery.timeout.ms": int(settings.producer.delivery_timeout_s * 1000),
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        # A job is one small request: sent at once, not held back until the broker acknowledges
        # the previous one (Nagle's algorithm against its delayed ACKs). Only recent librdkafka
        # releases turn Nagle off by default; older ones that confluent-kafka 2.6 brings do not.
        "socket.nagle.disable": True,
    }
    conf.update(settings.client_config())
    return conf


class KafkaTransport:
    """Lazily created idempotent producers that turn librdkafka's failures into our errors.

    Two producers when ``producer.bulk_linger_ms`` differs from ``producer.linger_ms``: single
    jobs go out at once, batches of ``enqueue_many`` linger to fill bigger requests (a linger
    is one setting for a whole librdkafka producer). A keyed job waits until the other producer
    has delivered what it holds, so that a key's jobs keep the order they were enqueued in.

    A forked child gets producers of its own on its first call (see :func:`_after_fork`).
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer: Producer | None = None
        self._bulk: Producer | None = None
        self._lock = threading.Lock()
        self._fatal: KafkaError | None = None
        self._refusal: str | None = None
        self._refused_at = 0.0
        self._health = BrokerHealth.of(settings.bootstrap_servers)
        self._two = settings.producer.bulk_linger_ms != settings.producer.linger_ms
        _transports.add(self)

    def _forget_parents_producers(self) -> None:
        """In a forked child: the parent's producers queue jobs but have no threads to send
        them (nor to flush at exit what the parent itself sends); the next call makes new ones."""
        for producer in self._producers():
            _never_destroy(producer)
        self._producer = self._bulk = None
        self._lock = threading.Lock()  # another thread of the parent may have held it
        self._fatal = None

    def _get(self, bulk: bool = False) -> Producer:
        bulk = bulk and self._two
        producer = self._bulk if bulk else self._producer
        if producer is None:
            with self._lock:
                producer = self._bulk if bulk else self._producer
                if producer is None:
                    producer = Producer(self._config(bulk))
                    if bulk:
                        self._bulk = producer
                    else:
                        self._producer = producer
        return producer

    def _config(self, bulk: bool) -> dict[str, Any]:
        conf = producer_config(self._settings, bulk=bulk)
        # librdkafka holds a job for a topic it cannot find this long before it fails it as
        # unknown. Its default, 30 s, is the delivery timeout's, which then failed the job
        # first, as if Kafka were down, without naming the topic.
        propagation_ms = int(self._settings.producer.delivery_timeout_s * 500)
        conf.setdefault(
            "topic.metadata.propagation.max.ms", min(_PROPAGATION_MAX_MS, propagation_ms)
        )
        # librdkafka's errors and log lines go to the cluster's health tracker (logging, one
        # line per outage), not straight to stderr.
        conf.update(
            self._health.callbacks("producer", on_error=self._on_error, on_refused=self._on_refused)
        )
        return conf

    def _producers(self) -> list[Producer]:
        return [p for p in (self._producer, self._bulk) if p is not None]

    def _after_the_other(self, bulk: bool, key: bytes | None) -> None:
        """Before a keyed job: let the other producer deliver what it holds (keeps key order)."""
        other = self._producer if bulk else self._bulk
        if key is not None and self._two and other is not None and len(other):
            other.flush(self._settings.producer.delivery_timeout_s)

    def _on_error(self, error: KafkaError) -> None:
        # Transport errors are retried by librdkafka until delivery.timeout.ms; only a fatal
        # error (e.g. the idempotent producer was fenced) makes the producer unusable.
        if error.fatal():
            self._fatal = error

    def _on_refused(self, text: str) -> None:
        self._refusal = text
        self._refused_at = time.monotonic()

    def _refused_now(self) -> bool:
        refused = self._refusal is not None
        return refused and time.monotonic() - self._refused_at < REFUSAL_FRESH_S

    def refused(self) -> KafkaAuthenticationError | None:
        """The error to raise when Kafka refused this producer's credentials or TLS handshake
        (within ``REFUSAL_FRESH_S``)."""
        if self._refusal is None or not self._refused_now():
            return None
        return authentication_error(self._settings, self._refusal)

    def _check(self) -> None:
        if self._fatal is not None:
            raise PipelineError(f"the Kafka producer failed for good: {self._fatal.str()}")
        refused = self.refused()
        if refused is not None:
            raise refused

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        producer = self._get()
        self._check()
        self._after_the_other(False, key)
        if self._health.down:  # an acknowledgement now tells that Kafka is back
            on_delivery = self._health.watch_delivery("producer", on_delivery)
        try:
            producer.produce(topic, value, key, on_delivery=on_delivery)
        except BufferError:
            # The local queue is full: wait for Kafka to drain it, within the delivery timeout.
            self._wait_for_room(producer, topic, value, key, on_delivery)
        except KafkaException as exc:
            raise PipelineError(f"cannot produce to {topic}: {exc.args[0].str()}") from exc

    def produce_many(
        self, topic: str, values: list[bytes], key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        """:meth:`produce` each of ``values``, with the checks made once for all of them."""
        producer = self._get(bulk=True)
        self._check()
        self._after_the_other(True, key)
        if self._health.down:
            on_delivery = self._health.watch_delivery("producer", on_delivery)
        produce = producer.produce
        try:
            for value in values:
                try:
                    produce(topic, value, key, on_delivery=on_delivery)
                except BufferError:
                    self._wait_for_room(producer, topic, value, key, on_delivery)
        except KafkaException as exc:
            raise PipelineError(f"cannot produce to {topic}: {exc.args[0].str()}") from exc

    def _wait_for_room(
        self,
        producer: Producer,
        topic: str,
        value: bytes,
        key: bytes | None,
        on_delivery: DeliveryCallback,
    ) -> None:
        deadline = time.monotonic() + self._settings.producer.delivery_timeout_s
        while True:
            producer.poll(0.05)
            self._check()
            try:
                producer.produce(topic, value, key, on_delivery=on_delivery)
            except BufferError:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"the local producer queue stayed full for "
                        f"{self._settings.producer.delivery_timeout_s:g}s: Kafka at "
                        f"{self._settings.bootstrap_servers} is not taking jobs. Is it running?"
                    ) from None
            else:
                return

    def poll(self, timeout: float = 0) -> int:
        producers = self._producers()
        if not producers:
            return 0
        served = sum(int(p.poll(0)) for p in producers[1:])
        return served + int(producers[0].poll(timeout))

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` for every queued job's acknowledgement; return how many are
        left (at once when Kafka refused the producer: :meth:`refused` says why)."""
        deadline = time.monotonic() + timeout
        left = 0
        for producer in self._producers():
            while True:
                step = min(WAIT_STEP_S, max(0.0, deadline - time.monotonic()))
                left_here = int(producer.flush(step))
                if not left_here or self._refused_now() or time.monotonic() >= deadline:
                    break
            left += left_here
        return left

    def purge(self) -> None:
        """Drop the jobs still queued or in flight; their delivery callbacks report the loss."""
        for producer in self._producers():
            producer.purge()

    def close(self) -> None:
        self._producer = None
        self._bulk = None


_transports: weakref.WeakSet[KafkaTransport] = weakref.WeakSet()


def _never_destroy(producer: Producer) -> None:
    """Keep one of the parent's producers alive for good, in a forked child.

    Destroying it waits for its threads and takes its locks, which are the parent's: a lock one
    of those threads held at the fork stays held in the child, where the destruction then waited
    for ever (or for seconds). Holding it from a Python list was not enough: the interpreter
    frees such objects when it shuts down, which hung the child's normal exit. A reference that
    nothing owns is never released.
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(producer))


def _after_fork() -> None:
    for transport in list(_transports):
        transport._forget_parents_producers()


os.register_at_fork(after_in_child=_after_fork)
