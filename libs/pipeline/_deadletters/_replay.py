"""Dead letters: read ``<ns>.dlq`` with what was done to each, filter, replay and discard.

``<ns>.dlq`` is append-only and written by workers in Kafka transactions. What an operator did
with a dead letter lives on the compacted one-partition ``<ns>.dlq-state`` topic, keyed by
dead-letter id, as JSON (``{"status": "replayed", "at": ms, "by": "user@host", "to": topic,
"job_id": ...}``; the later record for a key wins). A replay or discard writes the jobs, their
state records and their lifecycle events in one transaction per batch, with the transactional id
``<ns>.dlq-cli``: a crash never replays a dead letter without recording it, nor the reverse, and
a second command of the namespace fences the first one (which then fails) before it reads the
state, so the two never act on the same dead letter.
"""

from __future__ import annotations

import getpass
import json
import logging
import re
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from fnmatch import fnmatchcase
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from .._admin import _ClientLog
from .._codec import DeadLetterCodec, EventCodec, JobCodec
from .._errors import ConfigurationError, DecodeError, KafkaUnavailableError, PipelineError
from .._job import Job, Priority, now_ms
from .._producer import producer_config
from .._records import DeadLetter, Event, EventKind
from .._settings import Settings
from .._topics import TopicNames
from .._transactions import Transactions

__all__ = [
    "DeadLetterNotFoundError",
    "DeadLetterSnapshot",
    "DlqStats",
    "LetterFilter",
    "LetterState",
    "LetterStatus",
    "Outgoing",
    "StoredLetter",
    "WriteReport",
    "actionable",
    "discard_letters",
    "dlq_depth",
    "dlq_stats",
    "dlq_transactional_id",
    "fold_states",
    "parse_when",
    "read_dead_letters",
    "read_states",
    "replay_job",
    "replay_letters",
    "replay_message",
]

_log = logging.getLogger("pipeline.dlq")
_UNAVAILABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
    }
)


class DeadLetterNotFoundError(PipelineError, LookupError):
    """No dead letter has the id (or the job id is ambiguous)."""


def dlq_transactional_id(namespace: str) -> str:
    """Shared by every replay and discard of a namespace, so that they fence each other."""
    return f"{namespace}.dlq-cli"


# --- state ----------------------------------------------------------------------------------


class LetterStatus(StrEnum):
    PENDING = "pending"
    REPLAYED = "replayed"
    DISCARDED = "discarded"


@dataclass(frozen=True, slots=True, kw_only=True)
class LetterState:
    """One record of ``<ns>.dlq-state``: what was done to a dead letter, when and by whom."""

    status: LetterStatus
    at: int
    by: str
    to: str | None = None
    job_id: str | None = None

    def to_json(self) -> bytes:
        record: dict[str, Any] = {"status": self.status.value, "at": self.at, "by": self.by}
        if self.to is not None:
            record["to"] = self.to
        record["job_id"] = self.job_id
        return json.dumps(record, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LetterState:
        """Raises ``ValueError`` for anything that is not a state record."""
        record = json.loads(data)
        if not isinstance(record, dict) or not isinstance(record.get("at"), int):
            raise ValueError(f"not a dead-letter state record: {data[:100]!r}")
        return cls(
            status=LetterStatus(str(record.get("status"))),
            at=record["at"],
            by=str(record.get("by") or "?"),
            to=record.get("to"),
            job_id=record.get("job_id"),
        )


def fold_states(records: Iterable[tuple[str, bytes | None]]) -> dict[str, LetterState]:
    """The state table from ``(key, value)`` records in log order: the later record wins, and a
    tombstone or a ``pending`` record puts a dead letter back to pending."""
    states: dict[str, LetterState] = {}
    for key, value in records:
        state = None
        if value is not None:
            try:
                state = LetterState.from_json(value)
            except (ValueError, TypeError) as exc:
                _log.warning("ignoring an invalid dead-letter state record for %s: %s", key, exc)
                continue
        if state is None or state.status is LetterStatus.PENDING:
            states.pop(key, None)
        else:
            states[key] = state
    return states


@dataclass(slots=True)
class StoredLetter:
    """A dead letter, where it is on ``<ns>.dlq``, and its state (``None``: pending)."""

    letter: DeadLetter
    partition: int
    offset: int
    state: LetterState | None = None

    @property
    def status(self) -> LetterStatus:
        return LetterStatus.PENDING if self.state is None else self.state.status


@dataclass(slots=True)
class DeadLetterSnapshot:
    """``<ns>.dlq`` as of one read, oldest first, with the records that could not be decoded."""

    topic: str
    letters: list[StoredLetter]
    undecodable: int = 0

    def select(self, letter_filter: LetterFilter) -> list[StoredLetter]:
        return [s for s in self.letters if letter_filter.matches(s.letter)]

    def find(self, ident: str) -> StoredLetter:
        """The dead letter with id ``ident``, or the only one holding job ``ident``."""
        for stored in self.letters:
            if stored.letter.id == ident:
                return stored
        of_job = [s for s in self.letters if s.letter.job_id == ident]
        if len(of_job) == 1:
            return of_job[0]
        if of_job:
            ids = ", ".join(s.letter.id for s in of_job)
            raise DeadLetterNotFoundError(
                f"job {ident} has {len(of_job)} dead letters ({ids}); give one dead-letter id"
            )
        raise DeadLetterNotFoundError(
            f"no dead letter or job with id {ident!r} on {self.topic}; "
            "`pipeline dlq ls --all` lists them"
        )


# --- reading --------------------------------------------------------------------------------


class _Reader:
    """One consumer and one deadline: reads whole topics, committed messages only."""

    def __init__(self, settings: Settings, timeout: float) -> None:
        self.settings = settings
        self.timeout = timeout
        self._end = time.monotonic() + timeout
        self._log = _ClientLog()
        conf: dict[str, Any] = {
            "group.id": f"{settings.namespace}.dlq-reader",  # required; never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",  # dead letters are written in transactions
            "auto.offset.reset": "earliest",
            # The end of a transactional partition is a commit marker, seen as EOF only by the
            # next fetch: do not let the broker hold that fetch for the default 500 ms.
            "fetch.wait.max.ms": 20,
            **settings.client_config(),
            "logger": self._log,
        }
        try:
            self.consumer = Consumer(conf)
        except KafkaException as exc:
            raise ConfigurationError(f"invalid Kafka client settings: {exc.args[0]}") from exc
        self._topics: dict[str, Any] | None = None

    def remaining(self) -> float:
        return max(0.1, self._end - time.monotonic())

    def unavailable(self, reason: object) -> KafkaUnavailableError:
        self.consumer.poll(0)  # collect librdkafka's log lines: they name the actual cause
        if self._log.last_problem:
            reason = f"{reason}; {self._log.last_problem}"
        return KafkaUnavailableError(
            f"Kafka at {self.settings.bootstrap_servers} did not answer within "
            f"{self.timeout:g}s ({reason}); is Kafka running? start one with `pipeline dev up`, "
            "or point PIPELINE_BOOTSTRAP_SERVERS at your cluster"
        )

    def partitions(self, topic: str) -> list[int]:
        if self._topics is None:
            try:
                # No topic argument: asking for a named topic may auto-create it on some brokers.
                self._topics = self.consumer.list_topics(timeout=self.remaining()).topics
            except KafkaException as exc:
                raise self.unavailable(exc.args[0].str()) from exc
        meta = self._topics.get(topic)
        if meta is None or meta.error is not None:
            raise ConfigurationError(
                f"topic {topic} does not exist on {self.settings.bootstrap_servers}; create the "
                f"topics of namespace {self.settings.namespace!r} with `pipeline topics apply`"
            )
        return sorted(meta.partitions)

    def read(self, *topics: str) -> dict[str, list[Message]]:
        """Every committed message of ``topics`` up to their ends as of this call, by topic."""
        ends: dict[tuple[str, int], int] = {}
        starts: list[TopicPartition] = []
        for topic in topics:
            for partition in self.partitions(topic):
                try:
                    low, high = self.consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=self.remaining()
                    )
                except KafkaException as exc:
                    raise self.unavailable(exc.args[0].str()) from exc
                if high > low:
                    ends[topic, partition] = high
                    starts.append(TopicPartition(topic, partition, low))
        messages: dict[str, list[Message]] = {topic: [] for topic in topics}
        if not starts:
            return messages
        self.consumer.assign(starts)
        while ends:
            if time.monotonic() >= self._end:
                left = ", ".join(sorted({topic for topic, _ in ends}))
                raise self.unavailable(f"{left} not read to the end, {len(ends)} partition(s) left")
            # A short wait: consume() returns when it has 500 messages or the wait is over.
            for message in self.consumer.consume(500, 0.02):
                self._take(message, ends, messages)
        return messages

    def _take(
        self,
        message: Message,
        ends: dict[tuple[str, int], int],
        out: dict[str, list[Message]],
    ) -> None:
        where = (message.topic() or "", message.partition() or 0)
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                ends.pop(where, None)
            elif error.code() in _UNAVAILABLE or error.retriable():
                _log.info("retrying after an error reading %s: %s", where[0], error.str())
            else:
                raise PipelineError(f"reading {where[0]} failed: {error.str()} ({error.name()})")
            return
        end = ends.get(where)
        offset = message.offset() or 0
        if end is None:
            return
        if offset < end:
            out[where[0]].append(message)
        if offset + 1 >= end:  # what comes after was written after this read started
            del ends[where]

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _keyed(messages: Iterable[Message]) -> Iterable[tuple[str, bytes | None]]:
    for message in messages:
        key = message.key()
        yield (key.decode("utf-8", "replace") if key else "", message.value())


def read_states(settings: Settings, *, timeout: float = 30.0) -> dict[str, LetterState]:
    """The whole ``<ns>.dlq-state`` table: dead-letter id -> what was done to it."""
    topic = TopicNames(settings.namespace).dlq_state
    with _Reader(settings, timeout) as reader:
        return fold_states(_keyed(reader.read(topic)[topic]))


def read_dead_letters(settings: Settings, *, timeout: float = 30.0) -> DeadLetterSnapshot:
    """Every dead letter on ``<ns>.dlq`` (as of the call) with its state, oldest first.

    Records that are not dead letters are counted in ``undecodable`` and left out. Raises
    :class:`KafkaUnavailableError` when Kafka does not answer within ``timeout`` seconds and
    :class:`ConfigurationError` when the topics do not exist.
    """
    names = TopicNames(settings.namespace)
    codec = DeadLetterCodec()
    with _Reader(settings, timeout) as reader:
        read = reader.read(names.dlq, names.dlq_state)
    states = fold_states(_keyed(read[names.dlq_state]))
    letters: list[StoredLetter] = []
    seen: set[str] = set()
    undecodable = 0
    for message in read[names.dlq]:
        try:
            letter = codec.decode(message.value() or b"")
        except DecodeError as exc:
            undecodable += 1
            _log.info(
                "undecodable record %s[%s]@%s: %s",
                names.dlq,
                message.partition(),
                message.offset(),
                exc.reason,
            )
            continue
        if letter.id in seen:  # written twice (a non-transactional producer's retry)
            continue
        seen.add(letter.id)
        position = (message.partition() or 0, message.offset() or 0)
        letters.append(StoredLetter(letter, *position, states.get(letter.id)))
    letters.sort(key=lambda s: (s.letter.dead_at, s.partition, s.offset))
    return DeadLetterSnapshot(names.dlq, letters, undecodable)


# --- filters --------------------------------------------------------------------------------

_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[smhdw])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_when(text: str, *, now: int | None = None) -> int:
    """Epoch milliseconds of ``text``: an ISO-8601 date or datetime (UTC unless it names an
    offset), or a duration ago such as ``45s``, ``30m``, ``2h``, ``7d``, ``2w`` or ``1h30m``.

    Raises ``ValueError`` saying what is accepted.
    """
    value = text.strip()
    if _DURATION.fullmatch(value):
        ago = sum(float(n) * _UNIT_MS[unit] for n, unit in _DURATION_PART.findall(value))
        return (now_ms() if now is None else now) - round(ago)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO-8601 datetime (e.g. 2025-01-31T12:00:00Z, "
            "2025-01-31) nor a duration ago (e.g. 30m, 2h, 7d)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class LetterFilter:
    """Which dead letters a command acts on. Every given criterion must hold; several values
    of one criterion are alternatives. ``since`` is inclusive, ``until`` exclusive (epoch ms of
    ``dead_at``); ``types`` take shell wildcards; ``error`` is a case-insensitive substring of
    the error class or message of the dead letter or of any attempt; ``ids`` match dead-letter
    ids and job ids."""

    types: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    error: str | None = None
    since: int | None = None
    until: int | None = None
    tenants: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        """True when it matches every dead letter."""
        return self == LetterFilter()

    def matches(self, letter: DeadLetter) -> bool:
        return (
            (not self.ids or letter.id in self.ids or (letter.job_id or "") in self.ids)
            and (not self.types or _type_matches(letter.job_type, self.types))
            and (not self.reasons or letter.reason.lower() in {r.lower() for r in self.reasons})
            and (not self.tenants or letter.tenant in self.tenants)
            and (self.since is None or letter.dead_at >= self.since)
            and (self.until is None or letter.dead_at < self.until)
            and (self.error is None or _has_error_text(letter, self.error.lower()))
        )


def _type_matches(job_type: str | None, patterns: tuple[str, ...]) -> bool:
    return job_type is not None and any(fnmatchcase(job_type, p) for p in patterns)


def _has_error_text(letter: DeadLetter, needle: str) -> bool:
    texts = [letter.error_class or "", letter.message]
    if letter.job is not None:
        for error in letter.job.errors:
            texts += [error.error_class, error.message]
    return any(needle in text.lower() for text in texts)


def actionable(
    letters: Iterable[StoredLetter], *, force: bool = False
) -> tuple[list[StoredLetter], Counter[LetterStatus]]:
    """The pending letters (all of them with ``force``), and how many were skipped, by status."""
    todo: list[StoredLetter] = []
    skipped: Counter[LetterStatus] = Counter()
    for stored in letters:
        if force or stored.status is LetterStatus.PENDING:
            todo.append(stored)
        else:
            skipped[stored.status] += 1
    return todo, skipped


# --- replay: what to send -------------------------------------------------------------------


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
        return Outgoing(
            to_topic or letter.source_topic, letter.raw_key, letter.raw_value, headers, None
        )
    job = replay_job(letter.job, reset_attempts=reset_attempts, priority=priority)
    key = letter.raw_key if job.idempotency_key is None else job.idempotency_key.encode()
    topic = to_topic or TopicNames(namespace).jobs(job.priority)
    return Outgoing(topic, key, (codec or JobCodec()).encode(job), headers, job)


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
            "logger": _ClientLog(),
        }
    )
    try:
        producer = Producer(conf)
    except KafkaException as exc:
        raise ConfigurationError(f"invalid Kafka client settings: {exc.args[0]}") from exc
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


def _operator() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


_Record = tuple[str, bytes | None, bytes, list[Any] | None]
_Build = Callable[[StoredLetter, int], tuple[list[_Record], LetterState]]


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
) -> WriteReport:
    if not letters:
        return WriteReport([], Counter())
    txn, producer = _dlq_transactions(settings, timeout)
    try:
        txn.init()
        # Read the state only now: no other command of this transactional id can commit any
        # more, so a concurrent replay or discard cannot act on the same letters behind our back.
        states = read_states(settings, timeout=timeout)
        fresh = [replace(s, state=states.get(s.letter.id)) for s in letters]
        todo, skipped = actionable(fresh, force=force)
        missing = needed_topics(todo) - _topics(producer, settings, timeout) if todo else set()
        if missing:
            raise ConfigurationError(
                f"topic(s) {', '.join(sorted(missing))} do not exist on "
                f"{settings.bootstrap_servers}; nothing was written (`pipeline topics apply` "
                "creates the namespace's topics)"
            )
        stamp = now_ms()
        done: list[StoredLetter] = []
        for start in range(0, len(todo), batch_size):
            batch = todo[start : start + batch_size]
            records: list[_Record] = []
            acted: list[StoredLetter] = []
            for stored in batch:
                built, state = build(stored, stamp)
                records += built
                acted.append(replace(stored, state=state))
            txn.run(partial(_produce_all, records))
            done += acted
            if on_progress is not None:
                on_progress(len(batch))
        return WriteReport(done, skipped)
    finally:
        txn.close()


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
) -> WriteReport:
    """Send ``letters`` back (see :func:`replay_message`) and mark them replayed.

    Letters already replayed or discarded (by the state read after fencing any concurrent
    command) are skipped unless ``force``. Each batch is one transaction holding the messages,
    their ``replayed`` state records and their ``replayed`` events (unless events are off).
    """
    state_topic = TopicNames(settings.namespace).dlq_state
    codec = JobCodec()
    events = EventCodec(codec.store)
    by = _operator()
    # Built before anything is written, so that a letter that cannot be replayed stops it all.
    outgoing = {
        s.letter.id: replay_message(
            s.letter,
            settings.namespace,
            reset_attempts=reset_attempts,
            priority=priority,
            to_topic=to_topic,
            codec=codec,
        )
        for s in letters
    }

    def build(stored: StoredLetter, at: int) -> tuple[list[_Record], LetterState]:
        letter = stored.letter
        out = outgoing[letter.id]
        state = LetterState(
            status=LetterStatus.REPLAYED, at=at, by=by, to=out.topic, job_id=letter.job_id
        )
        records: list[_Record] = [
            (out.topic, out.key, out.value, out.headers or None),
            (state_topic, letter.id.encode(), state.to_json(), None),
        ]
        detail = f"dead letter {letter.id} replayed to {out.topic} by {by}"
        records += _event_record(
            settings, events, letter, kind=EventKind.REPLAYED, job=out.job, at=at, detail=detail
        )
        return records, state

    def needed(todo: list[StoredLetter]) -> set[str]:
        return {outgoing[s.letter.id].topic for s in todo} | _state_topics(settings)

    return _write(
        settings,
        letters,
        build,
        needed,
        force=force,
        batch_size=batch_size,
        timeout=timeout,
        on_progress=on_progress,
    )


def discard_letters(
    settings: Settings,
    letters: Sequence[StoredLetter],
    *,
    batch_size: int = 500,
    timeout: float = 30.0,
    on_progress: Callable[[int], None] | None = None,
) -> WriteReport:
    """Mark the pending ``letters`` discarded: state records and ``discarded`` events, one
    transaction per batch. Letters already replayed or discarded are skipped."""
    state_topic = TopicNames(settings.namespace).dlq_state
    events = EventCodec()
    by = _operator()

    def build(stored: StoredLetter, at: int) -> tuple[list[_Record], LetterState]:
        letter = stored.letter
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


# --- stats ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DlqStats:
    """Counts of a snapshot; ``depth`` (pending dead letters) is the number to alert on."""

    by_status: dict[str, int]
    pending_by_reason: dict[str, int]
    pending_by_type: dict[str, int]
    undecodable: int

    @property
    def depth(self) -> int:
        return self.by_status[LetterStatus.PENDING.value]


def dlq_stats(snapshot: DeadLetterSnapshot) -> DlqStats:
    statuses = Counter(s.status.value for s in snapshot.letters)
    pending = [s.letter for s in snapshot.letters if s.status is LetterStatus.PENDING]
    reasons = Counter(letter.reason for letter in pending)
    types = Counter(letter.job_type or "(unknown)" for letter in pending)
    return DlqStats(
        by_status={status.value: statuses[status.value] for status in LetterStatus},
        pending_by_reason=_by_count(reasons),
        pending_by_type=_by_count(types),
        undecodable=snapshot.undecodable,
    )


def _by_count(counts: Counter[str]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def dlq_depth(settings: Settings, *, timeout: float = 30.0) -> int:
    """How many dead letters are pending: neither replayed nor discarded."""
    return dlq_stats(read_dead_letters(settings, timeout=timeout)).depth
