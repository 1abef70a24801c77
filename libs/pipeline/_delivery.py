"""Delivery reports: a job Kafka refused or did not answer for, and a handle to wait on one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from threading import get_ident
from typing import Protocol, TypeAlias

from confluent_kafka import KafkaError, Message

from ._avro import HEADER_SIZE, MARKER
from ._avrogen import _read_long as read_long
from ._errors import (
    EnqueueError,
    KafkaUnavailableError,
    PipelineError,
    ProducerFatalError,
    not_authorized,
)
from ._schemaregistry import FRAME_SIZE, MAGIC
from ._settings import Settings
from ._transport import UNREACHABLE_CODES, DeliveryCallback, Transport, fatal_of, refusal_of

_MISSING_TOPIC_CODES = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART})
_TOPIC_REFUSALS = _MISSING_TOPIC_CODES | {KafkaError.TOPIC_AUTHORIZATION_FAILED}
"""What Kafka says of a topic, whether in a delivery report or from ``produce`` itself."""
_UNKNOWN_ID = "<unknown>"
_CALLBACKS_KEPT = 256
"""Delivery callbacks a generation keeps at most, one per sending thread."""
_MAX_ID_BYTES = 1024
"""A longer "id" is taken for bytes that are no job envelope."""


def job_id_of(value: bytes) -> str:
    """The id of the job envelope ``value`` (single-object or registry framed), read from its
    first field; ``<unknown>`` for bytes that are not one.

    A delivery report reads no more than that: decoding the envelope may need the schema
    registry (the writer schema of a framed one), which a reader waits for as long as it takes,
    and the report is served inside ``flush()`` and the exit flush, which must end when Kafka
    does not answer, whether the registry does or not.
    """
    if value[:2] == MARKER:
        pos = HEADER_SIZE
    elif value[:1] == MAGIC:
        pos = FRAME_SIZE
    else:
        return _UNKNOWN_ID
    try:
        length, pos = read_long(value, pos)  # the id string's length
    except (IndexError, ValueError):
        return _UNKNOWN_ID
    if not 0 < length <= _MAX_ID_BYTES or pos + length > len(value):
        return _UNKNOWN_ID
    try:
        return bytes(value[pos : pos + length]).decode()
    except UnicodeDecodeError:
        return _UNKNOWN_ID


@dataclass(frozen=True, slots=True)
class PipelineFailure:
    """A job Kafka did not acknowledge, as reported by its delivery callback; ``fatal``: the
    fatal error of the producer that held it, when that one failed for good."""

    job_id: str
    topic: str
    code: int
    reason: str
    fatal: str | None = None

    @classmethod
    def from_delivery(
        cls, error: KafkaError, message: Message, fatal: str | None = None
    ) -> PipelineFailure:
        """The failure of ``message``, a job envelope (its id is read, not decoded: see
        :func:`job_id_of`)."""
        job_id = job_id_of(message.value() or b"")
        return cls(job_id, message.topic() or "?", error.code(), error.str(), fatal)

    @property
    def why(self) -> str:
        """The reason, with the producer's fatal error when there is one."""
        if self.fatal is None:
            return self.reason
        return f"{self.reason} (the producer failed for good: {self.fatal})"

    def error(self, settings: Settings) -> EnqueueError | KafkaUnavailableError:
        if self.fatal is not None:
            return ProducerFatalError(self.job_id, self.reason, self.fatal)
        if self.code in UNREACHABLE_CODES:
            return KafkaUnavailableError(
                f"job {self.job_id} was not acknowledged by Kafka at {settings.bootstrap_servers}"
                f" within {settings.producer.delivery_timeout_s:g}s ({self.reason}); "
                "is it running? (`pipeline dev up` starts one)"
            )
        if self.code in _MISSING_TOPIC_CODES:
            return EnqueueError(
                self.job_id,
                f"topic {self.topic} does not exist; create the topics with "
                "`pipeline topics apply`",
            )
        if self.code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            user = settings.security.sasl_username
            return EnqueueError(self.job_id, not_authorized("TOPIC", self.topic, "WRITE", user))
        return EnqueueError(self.job_id, self.reason)


def produce_refusal(
    error: KafkaError, topic: str, value: bytes, settings: Settings
) -> PipelineError:
    """The error of a ``produce`` that refused ``value`` at once with ``error``: a topic that
    librdkafka learned is missing, or that this client may not write to, is said as the
    delivery report of such a job says it (:meth:`PipelineFailure.error`)."""
    if error.code() in _TOPIC_REFUSALS:
        return PipelineFailure(job_id_of(value), topic, error.code(), error.str()).error(settings)
    return PipelineError(f"cannot produce to {topic}: {error.str()}")


Deliver: TypeAlias = "Callable[[Generation, int, KafkaError | None, Message], None]"
"""What answers a job's delivery report: ``deliver(generation, sender, error, message)``."""


class Generation:
    """The jobs handed to the producer between two ``flush()`` calls: how many (``sent``), and
    how many had their delivery report (``answered``). ``number`` orders them: a flush waits
    for those of the generations before it (:class:`pipeline._failurelog.FailureLog`)."""

    __slots__ = ("_callbacks", "_deliver", "answered", "number", "sent")

    def __init__(self, number: int, deliver: Deliver) -> None:
        self.number = number
        self.sent = 0
        self.answered = 0
        self._deliver = deliver
        self._callbacks: dict[int, DeliveryCallback] = {}

    def on_delivery(self) -> DeliveryCallback:
        """The delivery callback of its jobs that the calling thread sends, made once a thread:
        ``deliver(generation, sender, ...)``, ``sender`` the thread's ``threading.get_ident()``
        (a flush on that thread is told of the job's failure: see ``FailureLog.take``)."""
        sender = get_ident()
        callback = self._callbacks.get(sender)
        if callback is None:
            # Each thread makes its own entry, and a dict's get and set are atomic. A generation
            # that takes the jobs of many threads (no flush for a long while) forgets the
            # callbacks it made (the jobs that hold them keep them): they are made again.
            if len(self._callbacks) >= _CALLBACKS_KEPT:
                self._callbacks = {}
            callback = self._callbacks[sender] = partial(self._deliver, self, sender)
        return callback


class FailureSink(Protocol):
    """Where delivery reports are counted and failures kept: an application's failure log
    (:class:`pipeline._failurelog.FailureLog`)."""

    def answer(
        self,
        generation: Generation | None,
        failure: PipelineFailure | None = None,
        *,
        tell: bool = True,
        sender: int | None = None,
    ) -> None: ...

    def add(self, failure: PipelineFailure) -> None: ...

    def raised(self, failure: PipelineFailure) -> None: ...

    def untold(self, failure: PipelineFailure) -> None: ...


class JobsFollowUps(Protocol):
    """The jobs a running job enqueued, as its delivery reports tell them (the worker's side:
    :class:`pipeline._followups.FollowUps`)."""

    def answered(
        self, failure: PipelineFailure | None, log: FailureSink | None, count: int = 1
    ) -> None: ...

    def discard(self, failure: PipelineFailure) -> None: ...


class JobHandle:
    """The pending acknowledgement of one submitted job."""

    __slots__ = (
        "_done",
        "_failure",
        "_failures",
        "_follow",
        "_generation",
        "_sender",
        "_settings",
        "_transport",
        "_waited",
        "job_id",
        "offset",
        "partition",
        "topic",
    )

    def __init__(
        self,
        transport: Transport,
        settings: Settings,
        failures: FailureSink | None = None,
        job_id: str = "",
    ) -> None:
        self.job_id = job_id
        """Set before the job is produced: its delivery report may come at once."""
        self._generation: Generation | None = None
        """The generation of the job's send (set with ``job_id``), which its report answers."""
        self._sender = get_ident()
        """The thread that sends the job: the one that makes its handle."""
        self.topic: str | None = None
        self.partition: int | None = None
        self.offset: int | None = None
        self._transport = transport
        self._settings = settings
        self._failures = failures
        self._done = threading.Event()
        self._failure: PipelineFailure | None = None
        self._waited = False
        self._follow: JobsFollowUps | None = None
        """The follow-ups of the running job that submitted this one, when one did: a refusal
        that :meth:`wait` raises is the handler's to handle, not its job's (:meth:`_followed`)."""

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        """Served by whichever thread polls the producer (the producer's own, too): what it
        sets is read once ``_done`` is set."""
        failure = self._answer(error, message)
        waited = self._waited
        if self._failures is not None:
            # Reported at flush or at exit, unless wait() raises it first (then not logged).
            self._failures.answer(self._generation, failure, tell=not waited, sender=self._sender)
        self._done.set()
        if waited and not self._waited:
            self._unraised()  # the wait gave up meanwhile, before it saw the job done

    def _followed(self, follow: JobsFollowUps, error: KafkaError | None, message: Message) -> None:
        """The delivery report of a job a running job submitted: its fate is that job's."""
        self._follow = follow
        failure = self._answer(error, message)
        if self._failures is not None:
            # answered; a refusal is the job's, not the log's
            self._failures.answer(self._generation)
        follow.answered(failure, self._failures)
        self._done.set()

    def _answer(self, error: KafkaError | None, message: Message) -> PipelineFailure | None:
        if error is not None:
            self._failure = PipelineFailure(
                self.job_id,
                message.topic() or "?",
                error.code(),
                error.str(),
                fatal_of(self._transport),
            )
            return self._failure
        self.topic = message.topic()
        self.partition = message.partition()
        self.offset = message.offset()
        return None

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> JobHandle:
        """Block until Kafka acknowledged the job; raise if it refused the job or the
        credentials (:class:`KafkaAuthenticationError`, at once) or did not answer."""
        if timeout is None:
            timeout = self._settings.producer.delivery_timeout_s + 5
        self._waited = True
        deadline = time.monotonic() + timeout
        while not self._done.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._give_up()
                raise KafkaUnavailableError(
                    f"job {self.job_id} was not acknowledged within {timeout:g}s by Kafka at "
                    f"{self._settings.bootstrap_servers}; is it running?"
                )
            self._transport.poll(min(remaining, 0.1))
            refused = refusal_of(self._transport)
            if refused is not None:
                self._give_up()
                raise refused
        failure = self._failure
        if failure is not None:
            if self._failures is not None:
                self._failures.raised(failure)
            if self._follow is not None:
                self._follow.discard(failure)
            raise failure.error(self._settings)
        return self

    def _give_up(self) -> None:
        """:meth:`wait` raises without the job's own failure: one that comes from now on is
        logged as any other, and so is one that came as it gave up (see :meth:`_on_delivery`)."""
        self._waited = False
        if self._done.is_set():
            self._unraised()

    def _unraised(self) -> None:
        if self._failure is not None and self._failures is not None:
            self._failures.untold(self._failure)
