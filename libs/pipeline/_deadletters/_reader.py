"""Reading ``<ns>.dlq`` and ``<ns>.dlq-state`` to their ends, committed records only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import ClusterMetadata

from .._clientlog import LastProblemLog
from .._codec import DeadLetterCodec
from .._errors import (
    DecodeError,
    KafkaAuthenticationError,
    KafkaUnavailableError,
    NotAuthorizedError,
    PipelineError,
)
from .._newclient import client
from .._partitions import cluster_metadata, topic_partitions, unavailable
from .._records import DeadLetter
from .._settings import Settings
from .._topics import TopicNames
from ._state import DeadLetterSnapshot, LetterState, StoredLetter, fold_states, letter_order

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


class _Reader:
    """One consumer and one deadline: reads whole topics, committed messages only."""

    def __init__(
        self,
        settings: Settings,
        timeout: float,
        *,
        prefetch_kb: int | None = None,
        idle_timeout: bool = False,
    ) -> None:
        """``prefetch_kb``: at most this much read ahead (librdkafka's default is 64 MB), for a
        reader kept alive, whose process would keep the memory of a bigger read-ahead.

        ``idle_timeout``: ``timeout`` bounds how long Kafka may go without handing over a
        record while a read goes on, not the whole read, which takes longer than that on a
        deep topic although Kafka answers all along. Without it, the whole read must end
        within ``timeout`` (a caller that reads in bounded steps, as the index does)."""
        self.settings = settings
        self.timeout = timeout
        self._idle_timeout = idle_timeout
        self._end = time.monotonic() + timeout
        self._log = LastProblemLog()
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
            # A partition whose read-ahead is full is fetched again this soon after it drains
            # (librdkafka's default waits 1 s, which a reader going to the end only waits out).
            "fetch.queue.backoff.ms": 10,
            **settings.client_config(),
            "logger": self._log,
        }
        if prefetch_kb is not None:
            conf["queued.max.messages.kbytes"] = prefetch_kb
        self.consumer = client(Consumer, conf)
        self._metadata: ClusterMetadata | None = None

    def remaining(self) -> float:
        return max(0.1, self._end - time.monotonic())

    def unavailable(self, reason: object) -> KafkaUnavailableError | KafkaAuthenticationError:
        return unavailable(self.consumer, self._log, self.settings, self.timeout, reason)

    def partitions(self, topic: str) -> list[int]:
        if self._metadata is None:
            # No topic argument: asking for a named topic may auto-create it on some brokers.
            # One listing serves every topic this reader reads until the clock restarts.
            self._metadata = cluster_metadata(
                self.consumer, self._log, self.settings, deadline=self._end, timeout=self.timeout
            )
        return topic_partitions(
            self.consumer,
            self._log,
            self.settings,
            topic,
            deadline=self._end,
            timeout=self.timeout,
            metadata=self._metadata,
        )

    def restart_clock(self, timeout: float) -> None:
        """A new deadline, ``timeout`` seconds from now, and fresh topic metadata: for a
        reader kept to read the same topics again."""
        self.timeout = timeout
        self._end = time.monotonic() + timeout
        self._metadata = None

    def watermarks(self, *topics: str) -> dict[tuple[str, int], tuple[int, int]]:
        """``(topic, partition) -> (low, high)`` of every partition of ``topics``; ``high``
        is the end a read_committed reader sees (what is after it is not committed yet)."""
        marks: dict[tuple[str, int], tuple[int, int]] = {}
        for topic in topics:
            for partition in self.partitions(topic):
                try:
                    marks[topic, partition] = self.consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=self.remaining()
                    )
                except KafkaException as exc:
                    raise self.unavailable(exc.args[0].str()) from exc
        return marks

    def read(
        self, *topics: str, keep: Callable[[Message], bool] | None = None
    ) -> dict[str, list[Message]]:
        """Every committed message of ``topics`` up to their ends as of this call, by topic;
        with ``keep``, only those it accepts (the others are not held in memory)."""
        marks = self.watermarks(*topics)
        starts = {where: low for where, (low, _) in marks.items()}
        return self.read_ranges(topics, starts, marks, keep)

    def read_ranges(
        self,
        topics: Iterable[str],
        starts: Mapping[tuple[str, int], int],
        marks: Mapping[tuple[str, int], tuple[int, int]],
        keep: Callable[[Message], bool] | None = None,
    ) -> dict[str, list[Message]]:
        """The committed messages of each partition from its offset in ``starts`` to its high
        watermark in ``marks`` (see :meth:`read`)."""
        ends: dict[tuple[str, int], int] = {}
        assignment: list[TopicPartition] = []
        for (topic, partition), start in starts.items():
            high = marks[topic, partition][1]
            if high > start:
                ends[topic, partition] = high
                assignment.append(TopicPartition(topic, partition, start))
        messages: dict[str, list[Message]] = {topic: [] for topic in topics}
        if not assignment:
            return messages
        self.consumer.assign(assignment)
        try:
            while ends:
                if time.monotonic() >= self._end:
                    left = ", ".join(sorted({topic for topic, _ in ends}))
                    raise self.unavailable(
                        f"{left} not read to the end, {len(ends)} partition(s) left"
                    )
                # A short wait: consume() returns when it has 500 messages or the wait is over.
                progress = False
                for message in self.consumer.consume(500, 0.02):
                    progress = self._take(message, ends, messages, keep) or progress
                if progress and self._idle_timeout:
                    self._end = time.monotonic() + self.timeout
        finally:
            # Stop fetching: a reader kept for another read would otherwise fetch on, and its
            # next watermark requests would wait behind those fetches.
            self.consumer.unassign()
        return messages

    def fetch(self, topic: str, partition: int, offset: int) -> Message:
        """The committed message at ``offset`` of ``topic[partition]``."""
        self.consumer.assign([TopicPartition(topic, partition, offset)])
        try:
            while time.monotonic() < self._end:
                for message in self.consumer.consume(1, 0.05):
                    error = message.error()
                    if error is None and message.offset() == offset:
                        return message
                    if error is None or error.code() == KafkaError._PARTITION_EOF:
                        raise PipelineError(f"no record at {topic}[{partition}]@{offset}")
                    if error.code() not in _UNAVAILABLE and not error.retriable():
                        raise PipelineError(
                            f"reading {topic} failed: {error.str()} ({error.name()})"
                        )
            raise self.unavailable(f"{topic}[{partition}]@{offset} not read")
        finally:
            self.consumer.unassign()

    def _take(
        self,
        message: Message,
        ends: dict[tuple[str, int], int],
        out: dict[str, list[Message]],
        keep: Callable[[Message], bool] | None,
    ) -> bool:
        """Take one message of a read; whether it was progress (a record or an end reached),
        rather than an error."""
        where = (message.topic() or "", message.partition() or 0)
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                ends.pop(where, None)
                return True
            if error.code() in _UNAVAILABLE or error.retriable():
                _log.info("retrying after an error reading %s: %s", where[0], error.str())
            elif error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                group = f"{self.settings.namespace}.dlq-reader"
                user = self.settings.security.sasl_username
                raise NotAuthorizedError("GROUP", group, "DESCRIBE", user)
            else:
                raise PipelineError(f"reading {where[0]} failed: {error.str()} ({error.name()})")
            return False
        end = ends.get(where)
        offset = message.offset() or 0
        if end is None:
            return True
        if offset < end and (keep is None or keep(message)):
            out[where[0]].append(message)
        if offset + 1 >= end:  # what comes after was written after this read started
            del ends[where]
        return True

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


def decode_letter(codec: DeadLetterCodec, message: Message) -> DeadLetter | None:
    """The dead letter in ``message``, or None (logged) for a record that is not one."""
    try:
        return codec.decode(message.value() or b"")
    except DecodeError as exc:
        _log.info(
            "undecodable record %s[%s]@%s: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            exc.reason,
        )
        return None


def read_states(settings: Settings, *, timeout: float = 30.0) -> dict[str, LetterState]:
    """The whole ``<ns>.dlq-state`` table: dead-letter id -> what was done to it."""
    topic = TopicNames(settings.namespace).dlq_state
    with _Reader(settings, timeout, idle_timeout=True) as reader:
        return fold_states(_keyed(reader.read(topic)[topic]))


def read_dead_letters(
    settings: Settings,
    *,
    timeout: float = 30.0,
    only: Callable[[DeadLetter], bool] | None = None,
) -> DeadLetterSnapshot:
    """Every dead letter on ``<ns>.dlq`` (as of the call) with its state, oldest first; with
    ``only``, just the letters it accepts (say a :class:`LetterFilter`'s ``matches``), each
    let go as soon as it is read otherwise: a deep topic read for a few of its letters does
    not hold all of them.

    Records that are not dead letters are counted in ``undecodable`` and left out. Raises
    :class:`KafkaUnavailableError` when Kafka does not answer within ``timeout`` seconds (the
    whole read may take longer while records keep coming) and :class:`ConfigurationError` when
    the topics do not exist.
    """
    names = TopicNames(settings.namespace)
    codec = DeadLetterCodec()
    letters: list[StoredLetter] = []
    seen: set[str] = set()
    undecodable = 0

    def keep(message: Message) -> bool:
        # Each dead letter is decoded as it is read and its record let go: holding the records
        # until the end would hold every dead letter twice, as bytes and decoded.
        nonlocal undecodable
        if message.topic() == names.dlq_state:
            return True
        letter = decode_letter(codec, message)
        if letter is None:
            undecodable += 1
        elif (only is None or only(letter)) and letter.id not in seen:
            # (seen: written twice, by a non-transactional producer's retry)
            seen.add(letter.id)
            letters.append(StoredLetter(letter, message.partition() or 0, message.offset() or 0))
        return False

    with _Reader(settings, timeout, idle_timeout=True) as reader:
        read = reader.read(names.dlq, names.dlq_state, keep=keep)
    states = fold_states(_keyed(read[names.dlq_state]))
    for stored in letters:
        stored.state = states.get(stored.letter.id)
    letters.sort(key=letter_order)
    return DeadLetterSnapshot(names.dlq, letters, undecodable)
