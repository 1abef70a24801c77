"""Replaying and discarding dead letters, one Kafka transaction per batch.

A replay or discard writes the jobs, their ``<ns>.dlq-state`` records and their lifecycle
events in one transaction per batch, with the transactional id ``<ns>.dlq-cli``: a crash never
replays a dead letter without recording it, nor the reverse, and a second command of the
namespace fences the first one (which then fails) before it reads the state, so the two never
act on the same dead letter.
"""

from __future__ import annotations

import copy
import getpass
import socket
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from confluent_kafka import KafkaException, Producer

from .._clientlog import LastProblemLog
from .._codec import EventCodec, JobCodec
from .._errors import (
    KafkaUnavailableError,
    PipelineError,
    TopicMissingError,
    TransactionFencedError,
)
from .._job import Job, Priority, now_ms
from .._newclient import client
from .._producer import producer_config
from .._records import DeadLetter, Event, EventKind
from .._settings import Settings
from .._topics import TopicNames
from .._transactions import Transactions
from ._outgoing import Outgoing, leave_empty, replay_message, senders
from ._reader import read_states
from ._state import LetterState, LetterStatus, StoredLetter, actionable


def dlq_transactional_id(namespace: str) -> str:
    """Shared by every replay and discard of a namespace, so that they fence each other."""
    return f"{namespace}.dlq-cli"


# --- writing: one transaction per batch -----------------------------------------------------


def _dlq_transactions(settings: Settings, timeout: float) -> tuple[Transactions, Producer]:
    """The ``<ns>.dlq-cli`` transactional producer (and the client, to list topics)."""
    txn_id = dlq_transactional_id(settings.namespace)
    conf = producer_config(settings)
    conf.update(
        {
            "transactional.id": txn_id,
            "linger.ms": 5,
            "transaction.timeout.ms": max(60_000, conf["delivery.timeout.ms"]),
            "logger": LastProblemLog(),
        }
    )
    producer = client(Producer, conf)
    txn = Transactions(
        producer,
        name=f"the dead-letter command's producer (Kafka at {settings.bootstrap_servers})",
        when_fenced=(
            f"another `pipeline dlq replay` or `discard` of namespace {settings.namespace!r} "
            f"started (transactional id {txn_id}) and stopped this one; the batches committed "
            "before stay done, the current one was not written. Check with "
            "`pipeline dlq ls --all` and run again when it is finished"
        ),
        timeout_s=timeout,
        acl=(txn_id, settings.security.sasl_username, "operator"),  # its role in _acls
    )
    return txn, producer


def _topics(producer: Producer, settings: Settings, timeout: float) -> set[str]:
    try:
        return set(producer.list_topics(timeout=timeout).topics)
    except KafkaException as exc:
        raise KafkaUnavailableError(
            f"Kafka at {settings.bootstrap_servers} did not answer within {timeout:g}s to "
            f"list topics ({exc.args[0].str()}); is Kafka running?"
        ) from exc


@dataclass(slots=True)
class WriteReport:
    """What a replay or discard did: the letters acted on, each with its new state (``to`` is
    where a replayed one went), and how many were skipped as already replayed or discarded."""

    done: list[StoredLetter]
    skipped: Counter[LetterStatus]
    empty: list[StoredLetter] = field(default_factory=list)
    """Pending letters a replay left as they hold nothing to send (:func:`leave_empty`)."""


def _operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


_Record = tuple[str, bytes | None, bytes, list[Any] | None]
_Build = Callable[[StoredLetter, int, StoredLetter], tuple[list[_Record], LetterState]]
"""``build(stored, at, sender)``: the records of acting on a letter and its new state;
``sender`` is the letter a replay sends its job with (itself, or its job's newest letter: see
:func:`._outgoing.senders`)."""


def _write(
    settings: Settings,
    letters: Sequence[StoredLetter],
    build: _Build,
    needed_topics: Callable[[list[StoredLetter]], set[str]],
    *,
    force: bool,
    batch_size: int,
    timeout: float,
    on_progress: Callable[[int], None] | None,
    sends: bool = False,
) -> WriteReport:
    """Act on the ``letters`` still to be acted on (:func:`actionable`), in transactions of
    ``batch_size`` letters, each holding what ``build`` makes of its letters; ``sends``: a
    replay, which leaves the letters holding nothing to send (:func:`leave_empty`)."""
    if not letters:
        return WriteReport([], Counter())
    txn, producer = _dlq_transactions(settings, timeout)
    try:
        txn.init()
        # Read the state only now: no other command of this transactional id can commit any
        # more, so a concurrent replay or discard cannot act on the same letters behind our back.
        states = read_states(settings, timeout=timeout)
        todo, skipped = actionable(letters, force=force, states=states)
        todo, empty = leave_empty(todo, skipped) if sends else (todo, [])
        missing = needed_topics(todo) - _topics(producer, settings, timeout) if todo else set()
        if missing:  # nothing was written
            raise TopicMissingError(sorted(missing), settings.namespace)
        stamp = now_ms()
        sending = senders(todo)
        done: list[StoredLetter] = []
        for batch in _batches(todo, sending, batch_size):
            records: list[_Record] = []
            acted: list[StoredLetter] = []
            for stored in batch:
                built, state = build(stored, stamp, sending[stored.letter.id])
                records += built
                acted.append(replace(stored, state=state))
            try:
                txn.run(partial(_produce_all, records))
            except KafkaUnavailableError as exc:
                if not txn.committing:
                    raise _after(exc, done) from exc  # nothing of this batch was committed
                raise KafkaUnavailableError(
                    "Kafka did not confirm the commit of the last batch of dead letters "
                    f"({len(batch)}, after {len(done)} committed): it may yet be committed. "
                    "Run the same command again, without --force, once Kafka answers: it "
                    "skips the dead letters already done"
                ) from exc
            except PipelineError as exc:
                raise _after(exc, done) from exc
            done += acted
            if on_progress is not None:
                on_progress(len(batch))
        return WriteReport(done, skipped, empty)
    finally:
        txn.close()


def _batches(
    todo: Sequence[StoredLetter], sending: Mapping[str, StoredLetter], size: int
) -> Iterator[list[StoredLetter]]:
    """``todo`` in batches of about ``size`` letters, oldest first, each letter in the batch of
    the letter that sends its job (:func:`senders`): an older letter of a job is marked replayed
    in the transaction that sends the job, never in one before it (a command stopped between
    the two would leave it marked, and nothing sent). A job with more letters than ``size``
    makes a larger batch."""
    groups: dict[str, list[StoredLetter]] = {}
    for stored in todo:
        groups.setdefault(sending[stored.letter.id].letter.id, []).append(stored)
    batch: list[StoredLetter] = []
    for group in groups.values():
        if batch and len(batch) + len(group) > size:
            yield batch
            batch = []
        batch += group
    if batch:
        yield batch


def _after(exc: PipelineError, done: Sequence[StoredLetter]) -> PipelineError:
    """``exc``, which stopped a command after the batches of ``done`` were committed, saying so
    (and :func:`letters_done` counting them): the same command with ``--force`` would act on
    them again (replay their jobs twice)."""
    if not done:
        return exc
    note = (
        f" ({len(done)} dead letters were done in the batches committed before: run the same "
        "command again, without --force, to go on with the others)"
    )
    if isinstance(exc, TransactionFencedError):
        told: PipelineError = TransactionFencedError(f"{exc}{note}", exc.reason)
    else:
        told = copy.copy(exc)
        told.args = (f"{exc}{note}",)
    told._letters_done = len(done)  # type: ignore[attr-defined]
    return told


def letters_done(exc: BaseException) -> int:
    """How many dead letters the batches committed before ``exc`` (or the error it was raised
    from) stopped a replay or a discard had done (0: none, or no such command)."""
    cause: BaseException | None = exc
    while cause is not None:
        done = getattr(cause, "_letters_done", None)
        if isinstance(done, int):
            return done
        cause = cause.__cause__
    return 0


def _produce_all(records: Sequence[_Record], txn: Transactions) -> None:
    for topic, key, value, headers in records:
        txn.produce(topic, value, key, headers=headers)


def _event_record(
    settings: Settings,
    codec: EventCodec,
    letter: DeadLetter,
    *,
    kind: EventKind,
    job: Job | None,
    at: int,
    detail: str,
) -> list[_Record]:
    if settings.events == "off" or letter.job_id is None:
        return []  # events are about jobs: a letter without a job id has none to name
    event = Event(
        job_id=letter.job_id,
        job_type=letter.job_type or "",
        kind=kind,
        attempt=job.attempt if job is not None else 0,
        priority=job.priority if job is not None else "",
        at=at,
        detail=detail,
    )
    events_topic = TopicNames(settings.namespace).events
    return [(events_topic, letter.job_id.encode(), codec.encode(event), None)]


def _state_topics(settings: Settings) -> set[str]:
    names = TopicNames(settings.namespace)
    return {names.dlq_state} | (set() if settings.events == "off" else {names.events})


def replay_letters(
    settings: Settings,
    letters: Sequence[StoredLetter],
    *,
    reset_attempts: bool = False,
    priority: Priority | str | None = None,
    to_topic: str | None = None,
    force: bool = False,
    batch_size: int = 500,
    timeout: float = 30.0,
    on_progress: Callable[[int], None] | None = None,
    by: str | None = None,
) -> WriteReport:
    """Send ``letters`` back (see :func:`replay_message`) and mark them replayed.

    ``by`` is who the state records and events name (default: ``user@host`` of this process).

    Letters already replayed or discarded (by the state read after fencing any concurrent
    command) are skipped unless ``force``, which replays again those still in the state they
    have in ``letters`` (not one replayed or discarded by someone else since). A job is sent
    once, with its newest letter, however many of its letters are replayed (one replayed
    before, failed and dead-lettered again: ``--force`` takes both); its older letters are
    marked replayed to the same topic. Each batch is one transaction holding the messages,
    their ``replayed`` state records and their ``replayed`` events (unless events are off).
    A pending letter with nothing to send is left as it is (:func:`leave_empty`,
    :attr:`WriteReport.empty`); a job sent with it taken is sent as its newest letter that
    holds it (the same job, id and payload, with an older attempt history).
    """
    state_topic = TopicNames(settings.namespace).dlq_state
    codec = JobCodec()
    events = EventCodec(codec.store)
    by = by or _operator()
    made: dict[str, Outgoing] = {}

    def outgoing(sender: StoredLetter) -> Outgoing:
        """What ``sender`` sends, made once. The senders' are all made (by :func:`needed`)
        before anything is written, so that one that cannot be replayed stops it all; a
        letter that does not send (an older one of its job) is never encoded."""
        found = made.get(sender.letter.id)
        if found is None:
            found = made[sender.letter.id] = replay_message(
                sender.letter,
                settings.namespace,
                reset_attempts=reset_attempts,
                priority=priority,
                to_topic=to_topic,
                codec=codec,
            )
        return found

    def build(
        stored: StoredLetter, at: int, sender: StoredLetter
    ) -> tuple[list[_Record], LetterState]:
        letter = stored.letter
        out = outgoing(sender)  # an older letter of a job: where its newest goes
        state = LetterState(
            status=LetterStatus.REPLAYED, at=at, by=by, to=out.topic, job_id=letter.job_id
        )
        records: list[_Record] = [(state_topic, letter.id.encode(), state.to_json(), None)]
        if sender is not stored:  # its job goes once, with its newest letter, in this command
            return records, state
        records.insert(0, (out.topic, out.key, out.value, out.headers or None))
        detail = f"dead letter {letter.id} replayed to {out.topic} by {by}"
        records += _event_record(
            settings, events, letter, kind=EventKind.REPLAYED, job=out.job, at=at, detail=detail
        )
        return records, state

    def needed(todo: list[StoredLetter]) -> set[str]:
        going = {outgoing(sender).topic for sender in senders(todo).values()}
        return going | _state_topics(settings)

    return _write(
        settings,
        letters,
        build,
        needed,
        force=force,
        batch_size=batch_size,
        timeout=timeout,
        on_progress=on_progress,
        sends=True,
    )


def discard_letters(
    settings: Settings,
    letters: Sequence[StoredLetter],
    *,
    batch_size: int = 500,
    timeout: float = 30.0,
    on_progress: Callable[[int], None] | None = None,
    by: str | None = None,
) -> WriteReport:
    """Mark the pending ``letters`` discarded: state records and ``discarded`` events, one
    transaction per batch. Letters already replayed or discarded are skipped. ``by`` is as
    for :func:`replay_letters`."""
    state_topic = TopicNames(settings.namespace).dlq_state
    events = EventCodec()
    by = by or _operator()

    def build(
        stored: StoredLetter, at: int, sender: StoredLetter
    ) -> tuple[list[_Record], LetterState]:
        letter = stored.letter  # a discard sends nothing, whatever ``sender`` says
        state = LetterState(status=LetterStatus.DISCARDED, at=at, by=by, job_id=letter.job_id)
        records: list[_Record] = [(state_topic, letter.id.encode(), state.to_json(), None)]
        detail = f"dead letter {letter.id} discarded by {by}"
        records += _event_record(
            settings, events, letter, kind=EventKind.DISCARDED, job=letter.job, at=at, detail=detail
        )
        return records, state

    return _write(
        settings,
        letters,
        build,
        lambda todo: _state_topics(settings),
        force=False,
        batch_size=batch_size,
        timeout=timeout,
        on_progress=on_progress,
    )
