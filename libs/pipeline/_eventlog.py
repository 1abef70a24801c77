"""Reading ``<ns>.events``: one job's history (``pipeline jobs show``) and a filtered follow
(``pipeline events tail``).

Events are keyed by job id, so a job's history is found by reading the whole topic (bounded by
its retention, ``topics.events_retention_ms``) and decoding only the records with that key; its
dead letters come from :func:`pipeline._deadletters.read_dead_letters`. What is there depends
on the ``events`` setting of the workers: ``errors`` (the default) writes retried, dead,
replayed and discarded; ``all`` adds started, progress, succeeded and deduplicated.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, KafkaError, KafkaException, TopicPartition

from ._codec import EventCodec
from ._deadletters import LetterStatus, StoredLetter, read_dead_letters
from ._deadletters import _Reader as TopicReader
from ._errors import DecodeError, PipelineError
from ._ratelog import RateLimitedLog
from ._records import Event, EventKind
from ._topics import TopicNames

if TYPE_CHECKING:
    from confluent_kafka import Message

    from ._settings import Settings

__all__ = ["EventFilter", "JobHistory", "follow_events", "job_history"]

_log = logging.getLogger("pipeline.events")


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events to keep: job types (shell wildcards), event kinds, job ids; empty = all."""

    types: Sequence[str] = ()
    kinds: Sequence[str] = ()
    job_ids: Sequence[str] = ()

    def matches(self, event: Event) -> bool:
        return (
            (not self.types or any(fnmatchcase(event.job_type, t) for t in self.types))
            and (not self.kinds or event.kind in self.kinds)
            and (not self.job_ids or event.job_id in self.job_ids)
        )


@dataclass(slots=True)
class JobHistory:
    """A job's events in time order and its dead letters; ``state`` says where it is."""

    job_id: str
    events: list[Event] = field(default_factory=list)
    letters: list[StoredLetter] = field(default_factory=list)
    scanned: int = 0
    """Records of ``<ns>.events`` read to find the events."""
    unreadable: int = 0
    """Records of the job (by their key) that could not be decoded as events: written by a
    newer version of the workers, or by another producer."""

    @property
    def found(self) -> bool:
        return bool(self.events or self.letters)

    @property
    def state(self) -> str:
        """What the last thing known is: ``succeeded``, ``dead (pending|replayed|discarded)``,
        ``waiting for a retry``, ``running``, ``replayed``... or ``unknown``."""
        ended = (EventKind.DEAD, EventKind.DISCARDED)
        newest = self.letters[-1] if self.letters else None
        if newest is not None and newest.status is LetterStatus.PENDING:
            return "dead (pending)"  # whatever came before: its last letter waits
        last = self._last_known()
        if newest is not None and (last is None or last.kind in ended):
            return f"dead ({newest.status.value})"
        if last is None:
            return "unknown"
        if last.kind == EventKind.DEDUPLICATED and any(
            e.kind == EventKind.SUCCEEDED for e in self.events
        ):
            return "succeeded"  # read again after it succeeded (its own id holds the key)
        states: dict[str, str] = {
            EventKind.STARTED: "running (or its worker stopped)",
            EventKind.PROGRESS: "running (or its worker stopped)",
            EventKind.RETRIED: "waiting for a retry",
            EventKind.REPLAYED: "replayed, waiting to run",
            EventKind.DEDUPLICATED: "skipped as a duplicate",
        }
        return states.get(last.kind, last.kind)

    def _last_known(self) -> Event | None:
        """The last event, but for a ``replayed`` one that the run it sent came after: a
        replay is stamped by the operator's clock, the run by the worker's, and they may tie
        or disagree by a few milliseconds. The death it answered, and the run that died, are not
        that run even within those milliseconds (a ``--reset-attempts`` replay sends attempt 1
        after a later one)."""
        events = _current(self.events)
        if not events:
            return None
        last = events[-1]
        if last.kind == EventKind.REPLAYED:
            since = last.at - CLOCK_SKEW_MS
            before = events[:-1]
            died = next(
                (i for i in reversed(range(len(before))) if before[i].kind == EventKind.DEAD),
                -1,
            )  # the death it answered: that run's events came before it
            ran = [
                e
                for e in before[died + 1 :]
                if e.kind != EventKind.REPLAYED and e.attempt >= last.attempt and e.at >= since
            ]
            if ran:
                return ran[-1]
        return last


_ENDS_ATTEMPT = frozenset(
    {
        EventKind.SUCCEEDED,
        EventKind.RETRIED,
        EventKind.DEAD,
        EventKind.DEDUPLICATED,
        EventKind.DISCARDED,
    }
)


def _current(events: list[Event]) -> list[Event]:
    """``events`` without the ``started`` and ``progress`` ones of an attempt that had ended.

    A plain function past its time limit goes on running on its thread (its attempt retried or
    dead already): its ``ctx.progress()`` calls still write events, which say nothing of where
    the job is now. A replay starts a new run, whose attempts may count from 1 again.
    """
    ended: set[int] = set()
    kept = []
    for event in events:
        if event.kind == EventKind.REPLAYED:
            ended.clear()
        elif event.kind in _ENDS_ATTEMPT:
            ended.add(event.attempt)
        elif event.attempt in ended:
            continue
        kept.append(event)
    return kept


CLOCK_SKEW_MS = 1000
"""How far the clocks of the operator's replay and of the worker that ran it may disagree."""

_STEPS: dict[str, int] = {
    EventKind.STARTED: 0,
    EventKind.PROGRESS: 1,
    EventKind.DEDUPLICATED: 2,
    EventKind.SUCCEEDED: 2,
    EventKind.RETRIED: 2,
    EventKind.DEAD: 2,
    EventKind.REPLAYED: -1,  # it names the attempt it sends: before that attempt's run
    EventKind.DISCARDED: 3,
}


def in_time_order(events: list[Event]) -> list[Event]:
    """``events`` by time, then by attempt, then by their step within an attempt.

    Timestamps are in milliseconds and a job that fails at once starts and ends in the same
    one; its events are not in that order on the topic either, since ``started`` comes from
    a best-effort producer and ``dead`` from the move's transaction.
    """
    return sorted(events, key=lambda e: (e.at, e.attempt, _STEPS.get(e.kind, 2)))


def _decode(codec: EventCodec, message: Message) -> Event | None:
    try:
        return codec.decode(message.value() or b"")
    except DecodeError as exc:
        _log.info(
            "undecodable event %s[%s]@%s: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            exc.reason,
        )
        return None


def job_history(
    settings: Settings,
    job_id: str,
    *,
    timeout: float = 30.0,
    letters: Callable[[str], list[StoredLetter]] | None = None,
) -> JobHistory:
    """Everything ``<ns>.events`` and ``<ns>.dlq`` hold about job ``job_id``.

    Reads the whole events topic (only the job's records are kept and decoded) and the whole
    dead-letter topic: the time grows with their retained size, the memory with the job's.
    ``letters`` (a job id to its dead letters, oldest first), when given, replaces the read of
    the dead-letter topic: a dashboard passes its index.
    """
    topic = TopicNames(settings.namespace).events
    key = job_id.encode()
    codec = EventCodec()
    scanned = 0

    def of_job(message: Message) -> bool:
        nonlocal scanned
        scanned += 1
        return message.key() == key

    # ``timeout`` bounds Kafka's silence, not the whole read: a deep events topic takes longer
    # to read while Kafka answers all along.
    with TopicReader(settings, timeout, idle_timeout=True) as reader:
        messages = reader.read(topic, keep=of_job)[topic]
    events = []
    unreadable = 0
    for message in messages:
        event = _decode(codec, message)
        if event is None:
            unreadable += 1
        elif event.job_id == job_id:
            events.append(event)
    history = JobHistory(job_id, in_time_order(events), scanned=scanned, unreadable=unreadable)
    if letters is not None:
        history.letters = letters(job_id)
    else:
        snapshot = read_dead_letters(
            settings, timeout=timeout, only=lambda letter: letter.job_id == job_id
        )
        history.letters = snapshot.letters
    return history


def follow_events(
    settings: Settings,
    event_filter: EventFilter,
    *,
    from_beginning: bool = False,
    until_idle: float | None = None,
    timeout: float = 30.0,
) -> Iterator[Event]:
    """Yield matching events of ``<ns>.events`` as they arrive (new ones only, unless
    ``from_beginning``), until the caller stops or, with ``until_idle``, no event at all
    has arrived for that many seconds while Kafka answered.

    While no event arrives, Kafka is asked for its metadata every second: Kafka not answering
    for ``timeout`` seconds raises :class:`KafkaUnavailableError` (a tail never waits silently
    on a lost cluster). The idle time does not end while Kafka does not answer, and starts
    again once it answers after an outage: the events written meanwhile are read first. With
    ``from_beginning`` it starts once every partition was read to its end.
    """
    topic = TopicNames(settings.namespace).events
    codec = EventCodec()
    undecodable = RateLimitedLog(_log, interval_s=60.0)
    with TopicReader(settings, timeout) as reader:
        partitions = reader.partitions(topic)
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        reader.consumer.assign([TopicPartition(topic, p, start) for p in partitions])
        clock = _TailClock(reader, topic, until_idle, timeout, partitions if from_beginning else [])
        while not clock.ended():
            try:
                messages = reader.consumer.consume(500, 0.2)
            except KafkaException as exc:
                raise reader.unavailable(exc.args[0].str()) from exc
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        clock.read_to_end(message.partition())
                    elif not error.retriable():
                        raise PipelineError(f"reading {topic} failed: {error.str()}")
                    continue
                clock.received()
                event = _decode(codec, message)
                if event is None:
                    undecodable.warning(
                        "event",
                        "left out records of %s that could not be decoded as events "
                        "(`pipeline --log-level INFO ...` says which): written by a newer version?",
                        topic,
                    )
                elif event_filter.matches(event):
                    yield event


class _TailClock:
    """When a tail is idle, and whether Kafka still answers it.

    ``unread``: the partitions read from the beginning and not to their end yet; the idle time
    starts once there are none (a slow first fetch, or one partition behind the others, does
    not end the tail as idle). An outage stops the idle time, which starts again once Kafka
    answers: what was written meanwhile is read before the tail ends.
    """

    def __init__(
        self,
        reader: TopicReader,
        topic: str,
        until_idle: float | None,
        timeout: float,
        unread: Sequence[int],
    ) -> None:
        self._reader = reader
        self._topic = topic
        self._until_idle = until_idle
        self._timeout = timeout
        self._unread = set(unread)
        self._last = self._answered = self._read = time.monotonic()
        """The last record; the last sign of Kafka answering; the last record or end read."""
        self._down = False

    def received(self) -> None:
        self._last = self._answered = self._read = time.monotonic()

    def read_to_end(self, partition: int | None) -> None:
        self._answered = self._read = time.monotonic()
        self._unread.discard(partition)

    def ended(self) -> bool:
        """Whether the tail is idle long enough; raises when Kafka does not answer it."""
        now = time.monotonic()
        if self._unread:
            if now - self._read >= self._timeout:
                raise self._reader.unavailable(
                    f"{self._topic} partition(s) {sorted(self._unread)} not read to their end "
                    f"for {self._timeout:g}s"
                )
            self._last = now
        idle = self._until_idle is not None and now - self._last >= self._until_idle
        if now - self._answered < _PROBE_S and not idle:
            return False
        if not _answers(self._reader, self._topic):
            self._down = True
            if time.monotonic() - self._answered >= self._timeout:
                raise self._reader.unavailable(f"{self._topic} not read for {self._timeout:g}s")
            return False
        self._answered = time.monotonic()
        if self._down:  # the idle time counts again, with Kafka answering
            self._down, self._last = False, self._answered
            return False
        return idle


_PROBE_S = 1.0
"""How often a tail that receives nothing asks whether Kafka still answers."""


def _answers(reader: TopicReader, topic: str) -> bool:
    """Whether Kafka answers a metadata request for ``topic`` (which exists: it is being read;
    the whole cluster's metadata every second would be a large answer on a large cluster)."""
    try:
        reader.consumer.list_topics(topic, timeout=_PROBE_S)
    except KafkaException:
        return False
    return True
