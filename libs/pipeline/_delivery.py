"""Delivery reports: a job Kafka refused or did not answer for, and a handle to wait on one."""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, Message

from ._avro import HEADER_SIZE, MARKER
from ._avrogen import _read_long as read_long
from ._errors import EnqueueError, KafkaUnavailableError, ProducerFatalError, not_authorized
from ._schemaregistry import FRAME_SIZE, MAGIC
from ._settings import Settings
from ._transport import UNREACHABLE_CODES, Transport, fatal_of, refusal_of

_MISSING_TOPIC_CODES = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART})
_UNKNOWN_ID = "<unknown>"
_MAX_ID_BYTES = 1024
"""A longer "id" is taken for bytes that are no job envelope."""
TELL_EVERY_S = 10.0
"""Failed jobs nobody raised are logged at most this often, in one line that counts them."""
_TOLD_IDS = 10
"""Job ids such a line names at most."""
_log = logging.getLogger("pipeline.producer")


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


class FailureLog:
    """The jobs Kafka did not acknowledge that nobody was told about yet (thread-safe), and
    how many jobs were handed to the producer (``sent``) and had their delivery report
    (``answered``).

    Those two count the jobs still unanswered (:meth:`unanswered`): the producer's queue length
    also counts librdkafka's pending events, so it can exceed the jobs by one or two. ``sent``
    is a plain counter, bumped by the enqueuing thread; ``answered`` is bumped under the lock
    (:meth:`answer`), since delivery reports are served by any thread, the producer's polling
    thread among them. A flush takes the smaller of them and the queue length. A forked child
    starts with none (see :meth:`_forget_the_parents`).

    The failures no call will raise (no ``flush()`` took them yet, no handle waits for them)
    are also logged at ERROR as they come, at most once per :data:`TELL_EVERY_S` (:meth:`tell`,
    from the producer's polling thread): a process that never flushes, or is killed before its
    exit flush, has said which jobs it lost.
    """

    __slots__ = (
        "__weakref__",
        "_failures",
        "_lock",
        "_told",
        "_told_at",
        "_untold",
        "answered",
        "sent",
    )

    def __init__(self) -> None:
        self._failures: list[PipelineFailure] = []
        self._untold: list[PipelineFailure] = []
        self._told: set[int] = set()
        """``id()`` of the failures :meth:`tell` logged (held in ``_failures`` until taken)."""
        self._told_at = -TELL_EVERY_S
        self._lock = threading.Lock()
        self.sent = 0
        self.answered = 0
        _logs.add(self)

    def _forget_the_parents(self) -> None:
        """In a forked child: the failures so far are the parent's jobs, which the parent
        reports (at its flush or exit); the child would tell them again as its own. A lock that
        another thread of the parent held stays held in the child: it gets a new one."""
        self._failures = []
        self._untold = []
        self._told = set()
        self._lock = threading.Lock()
        self.sent = self.answered = 0

    def unanswered(self, queued: int) -> int:
        """How many of the ``queued`` messages and events a producer still holds are jobs."""
        return max(0, min(queued, self.sent - self.answered))

    def answer(self, failure: PipelineFailure | None = None, *, tell: bool = True) -> None:
        """A job's delivery report came: acknowledged, or ``failure`` (``tell``: to be logged
        unless a call raises it first)."""
        with self._lock:
            self.answered += 1
            if failure is not None:
                self._failures.append(failure)
                if tell:
                    self._untold.append(failure)

    def add(self, failure: PipelineFailure) -> None:
        with self._lock:
            self._failures.append(failure)
            self._untold.append(failure)

    def discard(self, failure: PipelineFailure) -> None:
        """``failure`` was raised to the caller: it needs no other report."""
        with self._lock:
            if failure in self._failures:
                self._failures.remove(failure)
            if failure in self._untold:
                self._untold.remove(failure)

    def take(self, *, told: bool = True) -> list[PipelineFailure]:
        """The failures not reported yet, oldest first; they count as reported now.
        ``told=False``: without those :meth:`tell` logged already (the exit report's: a job
        is not named twice; a ``flush()`` raises them all the same)."""
        with self._lock:
            failures, self._failures = self._failures, []
            if not told:
                failures = [f for f in failures if id(f) not in self._told]
            self._untold = []
            self._told = set()
        return failures

    def tell(self, settings: Settings, now: float | None = None) -> None:
        """Log at ERROR the failures no call raised nor logged yet, unless a line was logged
        less than :data:`TELL_EVERY_S` ago (they wait for the next). They stay for ``flush()``
        and the exit report."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._untold or now - self._told_at < TELL_EVERY_S:
                return
            failures, self._untold = self._untold, []
            self._told.update(map(id, failures))
            self._told_at = now
        ids = [f.job_id for f in failures]
        timeout = settings.producer.delivery_timeout_s
        reasons = sorted({_reason(f, timeout) for f in failures})
        _log.error(
            "%d enqueued job(s) never reached Kafka at %s and will not run (%s); job ids: %s%s. "
            "Nothing retries them: enqueue them again if they must run (flush() and "
            "enqueue(..., wait=True) raise such failures; see docs/operations.md, "
            "'When Kafka is down')",
            len(failures),
            settings.bootstrap_servers,
            "; ".join(reasons[:3]),
            ", ".join(ids[:_TOLD_IDS]),
            f" and {len(ids) - _TOLD_IDS} more" if len(ids) > _TOLD_IDS else "",
            extra={"failed_jobs": len(failures), "job_ids": ids[:_TOLD_IDS]},
        )


def _reason(failure: PipelineFailure, timeout: float) -> str:
    if failure.fatal is None and failure.code in UNREACHABLE_CODES:
        return f"not acknowledged within the delivery timeout of {timeout:g}s: {failure.reason}"
    return failure.why


_logs: weakref.WeakSet[FailureLog] = weakref.WeakSet()


def _after_fork() -> None:
    for log in list(_logs):
        log._forget_the_parents()


os.register_at_fork(after_in_child=_after_fork)


class JobsFollowUps(Protocol):
    """The jobs a running job enqueued, as its delivery reports tell them (the worker's side:
    :class:`pipeline._followups.FollowUps`)."""

    def answered(
        self, failure: PipelineFailure | None, log: FailureLog | None, count: int = 1
    ) -> None: ...

    def discard(self, failure: PipelineFailure) -> None: ...


class JobHandle:
    """The pending acknowledgement of one submitted job."""

    __slots__ = (
        "_done",
        "_failure",
        "_failures",
        "_follow",
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
        failures: FailureLog | None = None,
        job_id: str = "",
    ) -> None:
        self.job_id = job_id
        """Set before the job is produced: its delivery report may come at once."""
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
        if self._failures is not None:
            # Reported at flush or at exit, unless wait() raises it first (then not logged).
            self._failures.answer(failure, tell=not self._waited)
        self._done.set()

    def _followed(self, follow: JobsFollowUps, error: KafkaError | None, message: Message) -> None:
        """The delivery report of a job a running job submitted: its fate is that job's."""
        self._follow = follow
        failure = self._answer(error, message)
        if self._failures is not None:
            self._failures.answer()  # answered; a refusal is the job's, not the log's
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
                raise KafkaUnavailableError(
                    f"job {self.job_id} was not acknowledged within {timeout:g}s by Kafka at "
                    f"{self._settings.bootstrap_servers}; is it running?"
                )
            self._transport.poll(min(remaining, 0.1))
            refused = refusal_of(self._transport)
            if refused is not None:
                raise refused
        failure = self._failure
        if failure is not None:
            if self._failures is not None:
                self._failures.discard(failure)
            if self._follow is not None:
                self._follow.discard(failure)
            raise failure.error(self._settings)
        return self
