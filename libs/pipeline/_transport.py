"""What the application needs from a producer (:class:`Transport`), and how it asks one why
jobs failed: Kafka refused its credentials (:func:`refusal_of`), or the producer failed for good
(:func:`fatal_of`). :class:`pipeline._producer.KafkaTransport` is the Kafka one;
:class:`pipeline.testing.InMemoryTransport` the in-memory one. :class:`BackgroundPoll` serves a
Kafka one's callbacks when the application does not. A batch handed over by ``produce_many``
that raised tells how many of its values the producer took (:func:`tell_taken`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from confluent_kafka import KafkaError

from ._brokerhealth import DeliveryCallback
from ._ratelog import RateLimitedLog

if TYPE_CHECKING:
    from ._errors import KafkaAuthenticationError

__all__ = [
    "POLL_EVERY_S",
    "UNREACHABLE_CODES",
    "BackgroundPoll",
    "DeliveryCallback",
    "Transport",
    "describe_fatal",
    "fatal_of",
    "never_destroy",
    "refusal_of",
    "taken_of",
    "tell_taken",
    "tells_taken",
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
    ``failed_for_good()``: what :func:`fatal_of` asks; and ``produce_many(topic, values, key,
    on_delivery)``: ``produce`` each of ``values``. With ``tells_taken`` true, an exception
    ``produce_many`` raises says how many of them it took before (:func:`tell_taken`; none if
    it says nothing), and a running job hands it whole batches of follow-ups; else one value a
    call, so that it counts each one the producer took.
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


_E = TypeVar("_E", bound=BaseException)


def tell_taken(exc: _E, taken: int) -> _E:
    """Attach to ``exc``, raised by a ``produce_many``, how many of its values the producer took
    before it (sent, unless Kafka refuses them): :func:`taken_of` reads it. Returns ``exc``."""
    with contextlib.suppress(AttributeError):  # an exception that takes no attribute
        exc.pipeline_taken = taken  # type: ignore[attr-defined]
    return exc


def taken_of(exc: BaseException, count: int) -> int:
    """How many of the ``count`` values handed to a ``produce_many`` that raised ``exc`` the
    producer took (:func:`tell_taken`; none if ``exc`` does not say)."""
    taken = getattr(exc, "pipeline_taken", 0)
    return min(max(taken, 0), count) if isinstance(taken, int) else 0


def tells_taken(exc: BaseException) -> bool:
    """Whether ``exc`` says how many values its ``produce_many`` took (:func:`tell_taken`)."""
    return isinstance(getattr(exc, "pipeline_taken", None), int)


def describe_fatal(error: KafkaError) -> str:
    """A fatal error as its messages name it: its code and librdkafka's words."""
    return f"{error.name()}: {error.str()}"


POLL_EVERY_S = 0.5
"""How often a background thread serves a producer that nothing else served meanwhile."""
_log = logging.getLogger("pipeline.producer")
_turn_errors = RateLimitedLog(_log, interval_s=60.0)


class BackgroundPoll:
    """A daemon thread that runs ``turn`` (a poll of a transport's producers), then ``hooks``,
    every :data:`POLL_EVERY_S`.

    librdkafka runs a producer's delivery reports, error callbacks and log lines only inside a
    ``poll()`` or ``flush()``: a process that enqueues now and then and never flushes (a web
    service) heard of a job Kafka failed, or of an outage, only at exit, if ever. The thread
    skips a turn while the application serves the producer itself (:meth:`served`: the
    periodic poll of a fast enqueue loop, a ``flush()``, a handle's ``wait()``), so that a busy
    producer's callbacks are not served by two threads fighting for the GIL. It holds the
    transport weakly: a transport dropped without ``close()`` ends it.

    :meth:`start` is idempotent. After :meth:`stop` no turn runs (one in progress is waited
    for; turns check the stop under the same lock), so the caller may release its producers.
    A forked child has no thread: ``in_child`` is called there (it calls :meth:`forget`), and
    the next :meth:`start` makes its own.
    """

    def __init__(
        self,
        turn: Callable[[], object],
        name: str,
        *,
        in_child: Callable[[], object] | None = None,
    ) -> None:
        self._turn = weakref.WeakMethod(turn)
        self._in_child = weakref.WeakMethod(in_child) if in_child else None
        self._name = name
        self.hooks: list[Callable[[], None]] = []
        """Called after each turn, on the thread (even when the turn was skipped)."""
        self.served_at = 0.0
        """When the producers were last served (``time.monotonic()``), by any thread."""
        self.forget()
        _pollers.add(self)

    def forget(self) -> None:
        """No thread, new locks: in a forked child (the parent's thread is not there)."""
        self._state = threading.Lock()
        self._turning = threading.RLock()  # a hook that closes the transport may stop it
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def served(self) -> None:
        self.served_at = time.monotonic()

    def start(self) -> None:
        with self._state:
            if self._thread is not None:
                return
            self._stopped = stopped = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(stopped,), name=self._name, daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the thread; once this returns, no turn runs."""
        with self._state:
            thread, self._thread = self._thread, None
            self._stopped.set()
        with self._turning:  # the turn in progress, if any, is over; none starts after
            pass
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self, stopped: threading.Event) -> None:
        while not stopped.wait(POLL_EVERY_S):
            with self._turning:
                turn = self._turn()
                if stopped.is_set() or turn is None:
                    return
                try:
                    if time.monotonic() - self.served_at >= POLL_EVERY_S / 2:
                        turn()
                    for hook in list(self.hooks):
                        hook()
                except Exception:
                    _turn_errors.error(
                        "poll", "serving the producer in the background failed", exc_info=True
                    )
                del turn


_pollers: weakref.WeakSet[BackgroundPoll] = weakref.WeakSet()


@atexit.register
def _stop_pollers() -> None:
    """At exit no thread serves a producer any more (the exit flush serves them itself)."""
    for poller in list(_pollers):
        poller.stop()


def _after_fork() -> None:
    for poller in list(_pollers):
        in_child = poller._in_child() if poller._in_child is not None else None
        if in_child is not None:
            in_child()
        else:
            poller.forget()


os.register_at_fork(after_in_child=_after_fork)


def never_destroy(producer: object) -> None:
    """Keep one of the parent's producers alive for good, in a forked child.

    Destroying it waits for its threads and takes its locks, which are the parent's: a lock one
    of those threads held at the fork stays held in the child, where the destruction then waited
    for ever (or for seconds). Holding it from a Python list was not enough: the interpreter
    frees such objects when it shuts down, which hung the child's normal exit. A reference that
    nothing owns is never released.
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(producer))
