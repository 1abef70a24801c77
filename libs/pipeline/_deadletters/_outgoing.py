"""What replaying a dead letter sends: the job, one attempt more and due now, to its priority's
topic; or, for a letter holding only the raw message, those bytes back where they came from."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .._codec import JobCodec
from .._errors import EncodeError, PipelineError
from .._job import Job, Priority
from .._records import DeadLetter
from .._topics import TopicNames
from ._state import LetterStatus, StoredLetter, letter_order


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
    try:
        value = (codec or JobCodec()).encode(job)
    except EncodeError as exc:  # another producer wrote what this one cannot write again
        raise PipelineError(
            f"dead letter {letter.id}: its job cannot be encoded again ({exc}); replay it with "
            "--reset-attempts if its attempt count is at fault, or discard it"
        ) from exc
    return Outgoing(topic, key, value, headers, job)


def senders(todo: Sequence[StoredLetter]) -> dict[str, StoredLetter]:
    """For each letter of ``todo`` (by id), the letter a replay of them all sends its job with:
    one per job, its newest letter (a job replayed, failed and dead-lettered again has several;
    sending each would run it once per letter); a letter that names no job sends itself."""
    newest: dict[str, StoredLetter] = {}
    for stored in todo:
        job_id = stored.letter.job_id
        if job_id is not None and (
            job_id not in newest or letter_order(stored) > letter_order(newest[job_id])
        ):
            newest[job_id] = stored
    return {s.letter.id: s if s.letter.job_id is None else newest[s.letter.job_id] for s in todo}


def replay_targets(
    todo: Sequence[StoredLetter],
    namespace: str,
    *,
    reset_attempts: bool = False,
    priority: Priority | str | None = None,
    to_topic: str | None = None,
) -> list[str]:
    """The topic a replay of ``todo`` sends each letter's job to (an older letter of a job:
    where its newest goes), in their order; raises as :func:`replay_message` does."""
    codec = JobCodec()
    sending = senders(todo)
    going = {
        s.letter.id: replay_message(
            s.letter, namespace, reset_attempts=reset_attempts, priority=priority,
            to_topic=to_topic, codec=codec,
        ).topic
        for s in sending.values()
    }  # fmt: skip
    return [going[sending[s.letter.id].letter.id] for s in todo]
