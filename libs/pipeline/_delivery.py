"""Delivery reports: a job Kafka refused or did not answer for, and a handle to wait on one."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, Message

from ._codec import JobCodec
from ._errors import DecodeError, EnqueueError, KafkaUnavailableError, not_authorized
from ._producer import UNREACHABLE_CODES, Transport, refusal_of
from ._settings import Settings

_MISSING_TOPIC_CODES = frozenset({KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART})


@dataclass(frozen=True, slots=True)
class PipelineFailure:
    """A job Kafka did not acknowledge, as reported by its delivery callback."""

    job_id: str
    topic: str
    code: int
    reason: str

    @classmethod
    def from_delivery(cls, codec: JobCodec, error: KafkaError, message: Message) -> PipelineFailure:
        value = message.value() or b""
        try:
            job_id = codec.decode(value).id
        except DecodeError:
            job_id = "<unknown>"
        return cls(job_id, message.topic() or "?", error.code(), error.str())

    def error(self, settings: Settings) -> EnqueueError | KafkaUnavailableError:
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
    """The jobs Kafka did not acknowledge that nobody was told about yet (thread-safe)."""

    __slots__ = ("_failures", "_lock")

    def __init__(self) -> None:
        self._failures: list[PipelineFailure] = []
        self._lock = threading.Lock()

    def add(self, failure: PipelineFailure) -> None:
        with self._lock:
            self._failures.append(failure)

    def discard(self, failure: PipelineFailure) -> None:
        """``failure`` was raised to the caller: it needs no other report."""
        with self._lock:
            if failure in self._failures:
                self._failures.remove(failure)

    def take(self) -> list[PipelineFailure]:
        """The failures not reported yet, oldest first; they count as reported now."""
        with self._lock:
            failures, self._failures = self._failures, []
        return failures


class JobHandle:
    """The pending acknowledgement of one submitted job."""

    __slots__ = (
        "_done",
        "_failure",
        "_failures",
        "_settings",
        "_transport",
        "job_id",
        "offset",
        "partition",
        "topic",
    )

    def __init__(
        self, transport: Transport, settings: Settings, failures: FailureLog | None = None
    ) -> None:
        self.job_id = ""
        self.topic: str | None = None
        self.partition: int | None = None
        self.offset: int | None = None
        self._transport = transport
        self._settings = settings
        self._failures = failures
        self._done = threading.Event()
        self._failure: PipelineFailure | None = None

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            failure = PipelineFailure(
                self.job_id, message.topic() or "?", error.code(), error.str()
            )
            self._failure = failure
            if self._failures is not None:
                # Reported at flush or at exit, unless wait() raises it first.
                self._failures.add(failure)
        else:
            self.topic = message.topic()
            self.partition = message.partition()
            self.offset = message.offset()
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> JobHandle:
        """Block until Kafka acknowledged the job; raise if it refused the job or the
        credentials (:class:`KafkaAuthenticationError`, at once) or did not answer."""
        if timeout is None:
            timeout = self._settings.producer.delivery_timeout_s + 5
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
            raise failure.error(self._settings)
        return self
