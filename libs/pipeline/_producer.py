"""A thin wrapper around confluent-kafka's Producer: safe defaults, created lazily, clear errors.

It is wrapped, not subclassed, so that the rest of the package depends on four methods only and
tests can swap it for an in-memory transport. A producer Kafka refuses (credentials, TLS:
:mod:`._authfailure`) raises :class:`KafkaAuthenticationError` from the next call, and its
waits stop at the refusal instead of at ``delivery.timeout.ms``. A producer that fails for good
(one of librdkafka's fatal errors) is replaced by a new one, as Spring Kafka and Confluent's
guidance do: the jobs it still held fail with the cause (:class:`ProducerFatalError`, see
:func:`fatal_of`), the next ones go to the new producer. A thread serves the producers'
callbacks when the application does not (:class:`BackgroundPoll`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from ._authfailure import Refusal
from ._brokerhealth import BrokerHealth
from ._clientlog import is_fatal
from ._delivery import produce_refusal
from ._errors import KafkaAuthenticationError, KafkaUnavailableError, PipelineError
from ._messagesize import (
    LIBRDKAFKA_MESSAGE_MAX_BYTES,
    PRODUCE_OVERHEAD,
    RECORD_OVERHEAD,
    fits_in_message,
    message_max_bytes,
    too_large,
)
from ._newclient import client
from ._producerconfig import producer_config
from ._settings import Settings
from ._transport import (
    UNREACHABLE_CODES,
    BackgroundPoll,
    DeliveryCallback,
    Transport,
    describe_fatal,
    fatal_of,
    refusal_of,
    taken_of,
    tell_taken,
)
from ._transport import never_destroy as _never_destroy

__all__ = [
    "LIBRDKAFKA_MESSAGE_MAX_BYTES",
    "PRODUCE_OVERHEAD",
    "RECORD_OVERHEAD",
    "UNREACHABLE_CODES",
    "DeliveryCallback",
    "KafkaTransport",
    "Transport",
    "fatal_of",
    "fits_in_message",
    "message_max_bytes",
    "producer_config",
    "refusal_of",
    "too_large",
]

_log = logging.getLogger("pipeline.producer")
WAIT_STEP_S = 0.2
"""A flush waits in steps this long, to stop at a refusal of the credentials."""
_PROPAGATION_MAX_MS = 30_000
"""How long a producer waits for a topic it cannot find at most (librdkafka's default); half
the delivery timeout when that is shorter, so that such a job fails as a missing topic."""


class KafkaTransport:
    """Lazily created idempotent producers that turn librdkafka's failures into our errors.

    Two producers when ``producer.bulk_linger_ms`` differs from ``producer.linger_ms``: single
    jobs go out at once, batches of ``enqueue_many`` linger to fill bigger requests (a linger
    is one setting for a whole librdkafka producer). A keyed job waits until the other producers
    have delivered what they hold, so that a key's jobs keep the order they were enqueued in.

    A producer that fails for good is *retired*: the next call makes a new one, and the retired
    one is still served (polled, flushed, purged) until it has told the fate of every job it
    held, each failed one with its fatal error (:meth:`failed_for_good`). confluent-kafka
    raises such an error once, from whichever poll or flush serves it (never to ``error_cb``),
    and ``produce`` then refuses every job with ``_FATAL``: both are caught here.

    A forked child gets producers of its own on its first call, and a polling thread of its own
    with them (:meth:`_forget_parents_producers`).
    """

    @property
    def tells_taken(self) -> bool:
        """Whether an exception of :meth:`produce_many` says how many values it took: its own
        does; a subclass's override says so by setting ``tells_taken`` itself."""
        return type(self).produce_many is KafkaTransport.produce_many

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._producer: Producer | None = None
        self._bulk: Producer | None = None
        self._retired: dict[Producer, KafkaError] = {}
        """Producers that failed for good (with their fatal error), until they hold nothing."""
        self._serving = threading.local()
        """``fatal``: the fatal error of the retired producer this thread serves now."""
        self._lock = threading.Lock()
        self._refusal = Refusal(settings)
        self._health = BrokerHealth.of(settings.bootstrap_servers)
        self._two = settings.producer.bulk_linger_ms != settings.producer.linger_ms
        self._poller = BackgroundPoll(
            self.poll, "pipeline-producer-poll", in_child=self._forget_parents_producers
        )
        """Serves the producers' callbacks when nothing else does, from the first producer on."""

    def _forget_parents_producers(self) -> None:
        """In a forked child: the parent's producers queue jobs but have no threads to send
        them (nor to flush at exit what the parent itself sends); the next call makes new ones."""
        for producer in self._all():
            _never_destroy(producer)
        self._producer = self._bulk = None
        self._retired = {}
        self._serving = threading.local()
        self._lock = threading.Lock()  # another thread of the parent may have held it
        self._poller.forget()

    def _get(self, bulk: bool = False) -> Producer:
        bulk = bulk and self._two
        producer = self._bulk if bulk else self._producer
        if producer is None:
            with self._lock:
                producer = self._bulk if bulk else self._producer
                if producer is None:
                    producer = client(Producer, self._config(bulk))
                    if bulk:
                        self._bulk = producer
                    else:
                        self._producer = producer
            self._poller.start()  # not under the lock: a turn may need it (to retire one)
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
        # line per outage), not straight to stderr. What else it reports to error_cb, it
        # retries until delivery.timeout.ms, and each job's delivery report tells its fate.
        conf.update(
            self._health.callbacks("producer", on_error=_ignore, on_refused=self._refusal.report)
        )
        return conf

    def _producers(self) -> list[Producer]:
        """The producers that take new jobs."""
        return [p for p in (self._producer, self._bulk) if p is not None]

    def _all(self) -> list[Producer]:
        """Every producer that may hold jobs: those that take new ones, then the retired."""
        return [*self._producers(), *self._retired]

    # -- a producer that fails for good ---------------------------------------------------

    def _retire(self, producer: Producer, error: KafkaError) -> None:
        """``producer`` failed for good with ``error``: the next call makes a new one."""
        with self._lock:
            if producer in self._retired:
                return
            self._retired[producer] = error
            if producer is self._producer:
                self._producer = None
            if producer is self._bulk:
                self._bulk = None
        _log.error(
            "the Kafka producer failed for good (%s); a new one sends the jobs enqueued from "
            "now on, and the jobs the failed one held fail with this cause (flush() raises "
            "ProducerFatalError for them)",
            describe_fatal(error),
        )

    def _serve(self, producer: Producer, call: Callable[[float], int], timeout: float) -> int:
        """``call(timeout)``, a poll or flush of ``producer``, with the fatal error it may
        raise taken as the producer's end (retired, and the queue length returned)."""
        fatal = self._retired.get(producer)
        self._serving.fatal = fatal  # the delivery reports served now are of a failed producer
        self._poller.served()
        try:
            return int(call(timeout))
        except KafkaException as exc:
            error = exc.args[0]
            if not is_fatal(error):
                raise
            self._retire(producer, error)
            return len(producer)
        finally:
            self._serving.fatal = None

    def failed_for_good(self) -> str | None:
        """The fatal error of the retired producer whose delivery reports this thread serves
        now (None: a working producer's), for :func:`fatal_of`."""
        fatal: KafkaError | None = getattr(self._serving, "fatal", None)
        return describe_fatal(fatal) if fatal is not None else None

    def _drop_drained(self) -> None:
        """Release the retired producers that told the fate of every job they held."""
        if self._retired:
            with self._lock:
                for producer in [p for p in self._retired if not len(p)]:
                    del self._retired[producer]

    # -- producing ------------------------------------------------------------------------

    def _after_the_others(self, bulk: bool, key: bytes | None) -> None:
        """Before a keyed job: let the other producers deliver what they hold (keeps key order),
        as a flush waits (:meth:`_drain`): within the delivery timeout, until a refusal."""
        if key is None:
            return
        other = self._producer if bulk else self._bulk
        waits = [other] if self._two and other is not None and len(other) else []
        waits += self._retired
        if waits:  # rarely: the clock is read only then
            deadline = time.monotonic() + self._settings.producer.delivery_timeout_s
            for producer in waits:
                self._drain(producer, deadline)

    def refused(self) -> KafkaAuthenticationError | None:
        """The error to raise when Kafka refused this producer's credentials or TLS handshake
        (within ``REFUSAL_FRESH_S``)."""
        return self._refusal.error()

    def _check(self) -> None:
        refused = self.refused()
        if refused is not None:
            raise refused

    def produce(
        self, topic: str, value: bytes, key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        producer = self._get()
        self._after_the_others(False, key)
        self._check()
        if self._health.down:  # an acknowledgement now tells that Kafka is back
            on_delivery = self._health.watch_delivery("producer", on_delivery)
        try:
            producer.produce(topic, value, key, on_delivery=on_delivery)
        except BufferError:  # the local queue is full: as a batch of one, which waits for room
            self._produce_on(producer, topic, (value,), key, on_delivery, bulk=False)
        except KafkaException as exc:  # it failed for good: a new producer takes the job
            self._refused(producer, topic, value, exc)
            self._produce_on(self._get(), topic, (value,), key, on_delivery, bulk=False)

    def produce_many(
        self, topic: str, values: list[bytes], key: bytes | None, on_delivery: DeliveryCallback
    ) -> None:
        """:meth:`produce` each of ``values``, with the checks made once for all of them; an
        exception it raises tells how many of them were taken before it (:func:`tell_taken`)."""
        producer = self._get(bulk=True)
        self._after_the_others(True, key)
        self._check()
        if self._health.down:
            on_delivery = self._health.watch_delivery("producer", on_delivery)
        self._produce_on(producer, topic, values, key, on_delivery, bulk=True)

    def _produce_on(
        self,
        producer: Producer,
        topic: str,
        values: Sequence[bytes],
        key: bytes | None,
        on_delivery: DeliveryCallback,
        *,
        bulk: bool,
    ) -> None:
        """Hand ``values`` to ``producer``, and what it did not take because it failed for
        good to a new one; an exception tells how many of them were taken before it."""
        taken = self._produce_all(producer, topic, values, key, on_delivery)
        if taken == len(values):
            return
        rest = values[taken:]
        try:
            more = self._produce_all(self._get(bulk), topic, rest, key, on_delivery)
        except BaseException as exc:
            tell_taken(exc, taken + taken_of(exc, len(rest)))
            raise
        if more < len(rest):
            error = f"cannot produce to {topic}: a new Kafka producer failed for good at once"
            raise tell_taken(PipelineError(error), taken + more)

    def _produce_all(
        self,
        producer: Producer,
        topic: str,
        values: Sequence[bytes],
        key: bytes | None,
        on_delivery: DeliveryCallback,
    ) -> int:
        """Hand ``values`` to ``producer``; how many it took before it failed for good (all of
        them, unless it did: it is retired then). An exception tells how many it took before."""
        produce = producer.produce
        taken = 0
        try:
            try:
                for value in values:
                    try:
                        produce(topic, value, key, on_delivery=on_delivery)
                    except BufferError:
                        # The local queue is full: wait for Kafka to drain it, within the
                        # delivery timeout.
                        self._wait_for_room(producer, topic, value, key, on_delivery)
                    taken += 1
            except KafkaException as exc:  # raises, unless it failed for good
                self._refused(producer, topic, values[taken], exc)
        except BaseException as exc:
            tell_taken(exc, taken)
            raise
        return taken

    def _refused(self, producer: Producer, topic: str, value: bytes, exc: KafkaException) -> None:
        """``producer.produce`` refused ``value`` with ``exc``: raises it as a delivery report
        would tell it (:func:`produce_refusal`), unless the producer failed for good; it is
        retired then."""
        error = exc.args[0]
        if not is_fatal(error):
            raise produce_refusal(error, topic, value, self._settings) from exc
        # produce() says only _FATAL: the cause waits in the queue poll() serves.
        self._serve(producer, producer.poll, 0)
        self._retire(producer, error)  # no-op once the poll told (and retired it)

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
            self._serve(producer, producer.poll, 0.05)
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

    # -- serving --------------------------------------------------------------------------

    def add_poll_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` on the polling thread every :data:`POLL_EVERY_S`, after its poll."""
        self._poller.hooks.append(hook)

    def stop_polling(self) -> None:
        """No thread serves the producers from now on (until a new producer is made)."""
        self._poller.stop()

    def poll(self, timeout: float = 0) -> int:
        producers = self._all()
        if not producers:
            return 0
        first, *others = producers
        served = sum(self._serve(p, p.poll, 0) for p in others)
        served += self._serve(first, first.poll, timeout)
        self._drop_drained()
        return served

    def flush(self, timeout: float) -> int:
        """Wait up to ``timeout`` for every queued job's acknowledgement; return how many are
        left (at once when Kafka refused the producer: :meth:`refused` says why)."""
        deadline = time.monotonic() + timeout
        left = sum(self._drain(producer, deadline) for producer in self._all())
        self._drop_drained()
        return left

    def _drain(self, producer: Producer, deadline: float) -> int:
        """Flush ``producer`` in steps until it holds nothing, Kafka refused the credentials
        or ``deadline`` passed; return how much it still holds."""
        while True:
            step = min(WAIT_STEP_S, max(0.0, deadline - time.monotonic()))
            left = self._serve(producer, producer.flush, step)
            if not left or self._refusal.fresh() or time.monotonic() >= deadline:
                return left

    def purge(self) -> None:
        """Drop the jobs still queued or in flight; their delivery callbacks report the loss."""
        for producer in self._all():
            producer.purge()

    def close(self) -> None:
        self._poller.stop()  # first: it never polls a producer released here
        self._producer = None
        self._bulk = None
        self._retired = {}


def _ignore(_error: KafkaError) -> None:
    return None
