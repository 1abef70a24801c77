"""What replaying a dead letter sends: the job, one attempt more and due now, to its priority's
topic; or, for a letter holding only the raw message, those bytes back where they came from."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .._codec import JobCodec
from .._errors import PipelineError
from .._job import Job, Priority
from .._records import DeadLetter
from .._topics import TopicNames
from ._state import LetterStatus, StoredLetter


def replay_job(
    job: Job, *, reset_attempts: bool = False, priority: Priority | str | None = None
) -> Job:
    """The job a replay sends: one more attempt (or attempt 1), due now, history kept."""
    return replace(
        job,
        attempt=1 if reset_attempts else job.attempt + 1,
        not_before=None,
        priority=job.priority if priority is None else Priority.parse(priority),
    )


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message a replay produces."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    job: Job | None


def sendable(letter: DeadLetter) -> bool:
    """Whether replaying ``letter`` has something to send: its job, or the raw message. A
    message too large to keep whole in its letter has neither; only a discard is left for it."""
    return letter.job is not None or letter.raw_value is not None


def leave_empty(
    todo: Sequence[StoredLetter], skipped: Counter[LetterStatus]
) -> tuple[list[StoredLetter], list[StoredLetter]]:
    """What a replay sends of ``todo`` (as :func:`actionable` picked it), and the pending
    letters it leaves as they hold nothing to send (:func:`sendable`). One of those already
    replayed or discarded (taken by ``force``) is counted in ``skipped`` by its status: there
    is nothing more to say about it."""
    sent: list[StoredLetter] = []
    empty: list[StoredLetter] = []
    for stored in todo:
        if sendable(stored.letter):
            sent.append(stored)
        elif stored.status is LetterStatus.PENDING:
            empty.append(stored)
        else:
            skipped[stored.status] += 1
    return sent, empty


def nothing_to_replay(count: int) -> str:
    """How a command says that ``count`` letters were left as they hold nothing to send."""
    if count == 1:
        return "1 holds neither a job nor the raw message, so nothing to replay: discard it"
    return f"{count} hold neither a job nor the raw message, so nothing to replay: discard them"


def replay_message(
    letter: DeadLetter,
    namespace: str,
    *,
    reset_attempts: bool = False,
    priority: Priority | str | None = None,
    to_topic: str | None = None,
    codec: JobCodec | None = None,
) -> Outgoing:
    """What replaying ``letter`` produces: the job (see :func:`replay_job`) to its priority
    topic (or ``to_topic``), keyed by its idempotency key or its original key; or, for a
    letter holding only raw bytes, those bytes with their key and headers, to ``to_topic`` or
    the topic they came from."""
    headers = list(letter.raw_headers.items())
    if letter.job is None:
        if letter.raw_value is None:
            raise PipelineError(
                f"dead letter {letter.id} holds neither a job nor the raw message: "
                "there is nothing to replay; discard it"
            )
        topic = to_topic if to_topic is not None else letter.source_topic
        return Outgoing(topic, letter.raw_key, letter.raw_value, headers, None)
    job = replay_job(letter.job, reset_attempts=reset_attempts, priority=priority)
    key = letter.raw_key if job.idempotency_key is None else job.idempotency_key.encode()
    topic = to_topic if to_topic is not None else TopicNames(namespace).jobs(job.priority)
    return Outgoing(topic, key, (codec or JobCodec()).encode(job), headers, job)
