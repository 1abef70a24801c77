"""The project's exception types.

Every error raised by ``pipeline`` derives from :class:`PipelineError`, and each message says
what went wrong and what to do about it. Lower-level causes are chained (``raise ... from exc``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PipelineError(Exception):
    """Base class of every error raised by this package."""


class ConfigurationError(PipelineError):
    """The settings are invalid or inconsistent."""

    exit_code = 2
    """The exit code of ``pipeline``, ``pipeline-worker`` and ``pipeline-scheduler`` for it: a
    usage mistake, as click's own (nothing was done; a restart with the same settings fails
    again)."""


class SettingsError(ConfigurationError):
    """A setting has an invalid value; the message names each one and where it came from."""


class UnknownPriorityError(ConfigurationError, ValueError):
    """A priority that is none of the four (``priority=`` of an enqueue, a job type, a
    schedule, a replay); the message names the valid ones. A ``ValueError`` too, as it was."""

    def __init__(self, value: object, priorities: Sequence[str]) -> None:
        super().__init__(f"unknown priority {value!r}; use one of: {', '.join(priorities)}")
        self.value = value
        self.priorities = tuple(priorities)


class PayloadValidationError(PipelineError, ValueError):
    """A job's payload does not match its job type's schema; that job was not sent.

    ``errors`` lists one ``"field: problem (got value)"`` line per bad field when the payload
    was checked against the handler's annotations (empty otherwise). Raised by a batch
    (``enqueue_many``), ``index`` is the failing payload's place in it and ``enqueued_ids`` the
    ids of the batch's jobs that were enqueued before it (``flush()`` waits for them); the
    message names both. Outside a batch ``index`` is None and ``enqueued_ids`` empty.
    """

    def __init__(
        self,
        job_type: str,
        reason: str,
        errors: tuple[str, ...] = (),
        *,
        index: int | None = None,
        enqueued_ids: Sequence[str] = (),
    ) -> None:
        where = "" if index is None else _place_in_batch(index, len(enqueued_ids))
        super().__init__(f"invalid payload for job type {job_type!r}: {where}{reason}")
        self.job_type = job_type
        self.reason = reason
        self.errors = errors
        self.index = index
        self.enqueued_ids = list(enqueued_ids)

    def in_batch(self, index: int, enqueued_ids: Sequence[str]) -> PayloadValidationError:
        """This error, as that of payload ``index`` of a batch whose jobs ``enqueued_ids`` were
        enqueued before it."""
        return PayloadValidationError(
            self.job_type, self.reason, self.errors, index=index, enqueued_ids=enqueued_ids
        )


def _place_in_batch(index: int, enqueued: int) -> str:
    before = f"the {index}" if enqueued == index else f"{enqueued} of the {index}"
    return (
        f"job #{index} of the batch ({before} before it were enqueued, it and the ones after it "
        "were not): "
    )


class UnknownJobTypeError(PipelineError, LookupError):
    """No handler is registered for a job type."""

    def __init__(self, job_type: str) -> None:
        super().__init__(
            f"no job type {job_type!r} is registered; register it with @app.job({job_type!r})"
        )
        self.job_type = job_type


class ScheduleNotFoundError(PipelineError, LookupError):
    """No schedule of that name is on ``<ns>.schedules``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no schedule named {name!r}; `pipeline schedules ls` lists them")
        self.name = name


class DecodeError(PipelineError):
    """Bytes could not be decoded as a job (or another record of the wire contract).

    ``raw`` keeps the undecodable bytes, so that a consumer can dead-letter them as they were.
    """

    def __init__(self, reason: str, raw: bytes) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class EncodeError(PipelineError, ValueError):
    """A record does not fit its schema (a programming error: nothing was sent)."""


class SchemaNotFoundError(DecodeError):
    """The writer schema's fingerprint is not one of the released schemas under ``schemas/``."""


class FailedJob(Protocol):
    """A job Kafka did not acknowledge, as ``flush()`` reports it."""

    @property
    def job_id(self) -> str: ...

    @property
    def topic(self) -> str: ...

    @property
    def reason(self) -> str: ...


class FailedJobs:
    """What the errors of ``flush()`` carry: every job Kafka did not acknowledge that the call
    reports (``failures``, oldest first, each with its ``job_id``, ``topic`` and ``reason``),
    and how many more failed whose failures were no longer kept (``not_kept``)."""

    failures: tuple[FailedJob, ...] = ()
    not_kept: int = 0

    @property
    def failed_ids(self) -> list[str]:
        """The ids of the jobs in :attr:`failures`, oldest first."""
        return [f.job_id for f in self.failures]


class KafkaUnavailableError(FailedJobs, PipelineError):
    """The Kafka cluster did not answer in time (broker down, wrong address, network)."""


def not_authorized(
    resource: str, name: str, operation: str, user: str | None, role: str | None = None
) -> str:
    """What to say when Kafka's authorizer refused ``user`` ``operation`` on a resource; the
    command to fix it names ``role`` when the caller knows it."""
    who = f"Kafka user {user}" if user else "this client"
    principal = f"User:{user}" if user else "User:<name>"
    return (
        f"not authorized: {who} lacks {operation} on {resource} {name} "
        f"({resource}_AUTHORIZATION_FAILED); allow it the ACLs of its role with "
        f"`pipeline acls apply --role {role or 'ROLE'} --principal {principal}` (docs/security.md)"
    )


class NotAuthorizedError(PipelineError):
    """Kafka's authorizer refused this client ``operation`` on a resource (no ACL allows it).

    A topic the client may not describe looks missing to it, so readers that find a topic
    missing ask again for that one topic and raise this when Kafka says why. A worker or a
    scheduler that meets it stops with :attr:`exit_code`, as for refused credentials: a restart
    cannot succeed before the ACLs change.
    """

    exit_code = 4
    """The exit code of ``pipeline-worker`` and ``pipeline-scheduler`` for it (that of
    :class:`KafkaAuthenticationError`)."""

    def __init__(
        self, resource: str, name: str, operation: str, user: str | None, role: str | None = None
    ) -> None:
        super().__init__(not_authorized(resource, name, operation, user, role))
        self.resource = resource
        self.name = name
        self.operation = operation
        self.user = user


class KafkaAuthenticationError(PipelineError):
    """Kafka refused this client as it connected: the SASL credentials (user name, password,
    mechanism) or the TLS handshake (the CA, a client certificate). Not an outage: retrying
    with the same settings cannot succeed, so clients stop at the first refusal instead of
    waiting for a timeout. The message names the mechanism and the user (never the password)
    and what to check; the services and commands exit with :attr:`exit_code`.
    """

    exit_code = 4
    """The exit code of ``pipeline``, ``pipeline-worker`` and ``pipeline-scheduler`` for it."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class TopicMissingError(PipelineError):
    """Topics a service needs do not exist (a setup step was skipped, or a wrong namespace)."""

    def __init__(self, topics: Sequence[str], namespace: str) -> None:
        others = f" (nor {', '.join(topics[1:])})" if len(topics) > 1 else ""
        super().__init__(
            f"topic {topics[0]} does not exist{others}; create the namespace's topics with "
            f"`pipeline topics apply --namespace {namespace}`"
        )
        self.topics = list(topics)
        self.namespace = namespace


class TopicAdminError(PipelineError):
    """Kafka refused a topic operation (policy, authorization, replication, invalid config)."""

    def __init__(self, topic: str | None, message: str) -> None:
        super().__init__(message)
        self.topic = topic


class EnqueueError(FailedJobs, PipelineError):
    """Kafka refused or could not acknowledge a job (``job_id``); raised by ``flush()``, it
    carries every failed job it reports (:class:`FailedJobs`)."""

    def __init__(self, job_id: str, reason: str) -> None:
        super().__init__(f"job {job_id} was not enqueued: {reason}")
        self.job_id = job_id
        self.reason = reason


class ProducerFatalError(EnqueueError):
    """The Kafka producer failed for good while it held this job: one of librdkafka's fatal
    errors (``cause``), e.g. the idempotent producer's broken sequence. No call of that producer
    can succeed any more; the application made a new one, which sends the jobs enqueued since.
    A job the failed producer still had queued was never sent; one in flight may have been
    written: enqueue it again if it must run (with an ``idempotency_key``, a copy runs once).
    """

    def __init__(self, job_id: str, reason: str, cause: str) -> None:
        PipelineError.__init__(
            self,
            f"job {job_id} may not have reached Kafka: the producer failed for good ({cause}) "
            f"while it held the job ({reason}). The jobs enqueued since go to a new producer; "
            "enqueue this one again if it must run",
        )
        self.job_id = job_id
        self.reason = reason
        self.cause = cause


class TimeLimitError(PipelineError, TimeoutError):
    """A job ran past its type's ``time_limit``; the worker failed it at the deadline."""

    def __init__(self, job_type: str, time_limit: float) -> None:
        super().__init__(f"job type {job_type!r} exceeded its time limit of {time_limit:g}s")
        self.job_type = job_type
        self.time_limit = time_limit


class TransactionError(PipelineError):
    """A Kafka transaction could not be committed; it was aborted, nothing of it is visible."""


class TransactionAbortedError(TransactionError):
    """Kafka required the open transaction to be aborted (librdkafka's ``txn_requires_abort``):
    it was, and what it held can be written again in a new one."""


class TransactionProducerFailedError(TransactionError):
    """A registered transactional producer failed for good on an error that is not a fence
    (librdkafka's fatal errors: the broker lost its transaction's state in a crash, its producer
    id expired): nothing of the open transaction was committed, and this producer writes nothing
    more. A new producer, registered anew, can write it again (the scheduler starts a new term
    with one)."""


class TransactionFencedError(PipelineError):
    """A transactional producer can write nothing more: a newer producer of its transactional
    id (or a newer consumer-group generation) fenced it, or it failed for good while registering
    (librdkafka's fatal errors). The process, or the command, must stop; the message says what
    to do."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason
