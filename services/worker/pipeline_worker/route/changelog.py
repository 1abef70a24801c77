"""The worker's deduplication state, kept in memory and restored from the ``<ns>.dedup`` changelog.

:class:`KafkaDedupStore` holds a :class:`pipeline._dedup.DedupTable` per owned partition number
(scope namespace: partition p of every priority topic shares it) or per owned job partition
(scope priority).
Settling and expiring return the changelog records that the worker writes in its transactions;
:meth:`KafkaDedupStore.load` rebuilds the tables of newly assigned partitions by reading their
changelog partitions from the beginning to the end they had when the load began. Changelog
partition p holds partition p of every priority topic, so one read serves every priority with
that number.

The reads are ``read_committed``: records of aborted transactions never count. The end read to
is the log end offset, not the last stable offset, so a restore waits for every transaction
open on the partition when it began. A transaction left open by a worker that crashed holds
the last stable offset back until Kafka aborts it (its ``transaction_timeout_ms``, plus up to
the broker's ``transaction.abort.timed.out.transaction.cleanup.interval.ms``), while the next
owner's committed records pile up behind it; a restore that stopped at the last stable offset
would miss those, and after a second crash their keys would run again. The worker commits its
own open transaction before a load starts (see ``intake.consumer``); the read runs on a helper
thread (``intake.keyload``) while the worker goes on, and a transaction it opens meanwhile on
a partition read (scope priority: a partition number it runs in another priority) holds the
read back only until its next commit, ``commit_interval_s`` later.

Load a partition after its committed offset has been read (a read_committed consumer's offset
fetch waits for a pending transactional commit of it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from pipeline._dedup import DedupScope, Where
from pipeline._dedupstores import PartitionTables
from pipeline._deduptable import DedupTable, restore_record
from pipeline._errors import ConfigurationError, PipelineError, not_authorized
from pipeline._job import now_ms
from pipeline._newclient import client

_log = logging.getLogger("pipeline.worker.dedup")

RESTORE_BATCH = 10_000
"""Messages taken from the consumer at a time while restoring."""
RESTORE_POLL_S = 0.1
RESTORE_TIMEOUT_S = 120.0


class DedupRestoreError(PipelineError):
    """The deduplication state of a partition could not be read from its changelog."""


class ChangelogSetupError(DedupRestoreError):
    """The changelog topic (or a partition of it) does not exist, or this client may not read
    it: a setup error, not an outage, so waiting does not help."""


class DedupRestoreTimeoutError(DedupRestoreError, TimeoutError):
    """A restore did not reach the end of its changelog partitions in time."""


class KafkaDedupStore(PartitionTables):
    """A :class:`pipeline.dedup.DedupStore` whose state lives in the changelog topic ``changelog``.

    ``conf`` holds the librdkafka options of the restore consumer (``bootstrap.servers``,
    security); the options a restore depends on are set here. ``consumer_factory`` makes the
    consumer (tests pass a fake) and ``clock`` says what is expired.
    """

    def __init__(
        self,
        changelog: str,
        conf: Mapping[str, Any],
        *,
        scope: DedupScope = DedupScope.NAMESPACE,
        restore_timeout_s: float = RESTORE_TIMEOUT_S,
        consumer_factory: Callable[[dict[str, Any]], Consumer] = Consumer,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        super().__init__(scope=scope)
        self.changelog = changelog
        self._conf = dict(conf)
        self._timeout_s = restore_timeout_s
        self._consumer_factory = consumer_factory
        self._clock = clock

    def load(self, partitions: Sequence[Where], *, timeout_s: float | None = None) -> None:
        """Restore the tables of ``partitions`` (replacing any held), within ``timeout_s``.

        Raises :class:`DedupRestoreTimeoutError` naming the partitions left unread, and
        :class:`DedupRestoreError` when Kafka refuses the read.
        """
        restoring = self.restoring(partitions, timeout_s=timeout_s)
        restoring.read()
        restoring.install(partitions)

    def restoring(
        self, partitions: Sequence[Where], *, timeout_s: float | None = None
    ) -> Restoring:
        """:meth:`load` in steps, so that only the read runs on another thread (see
        ``intake.keyload``): here, on the thread that loads and unloads, ``partitions`` whose
        slot has a table already join it; :meth:`Restoring.read` reads the tables of the rest,
        and :meth:`Restoring.install` makes them the store's, back on this thread."""
        # A partition whose slot has a table already shares it: that table is current (only
        # the owner of a slot writes its keys), and reading it again would forget the keys
        # its running jobs claimed.
        fresh = [where for where in partitions if not self.join(where)]
        tables: dict[Where, DedupTable] = {}
        by_number: dict[int, dict[str, DedupTable]] = {}
        for where in fresh:
            label, partition = self.slot(where)
            of_number = by_number.setdefault(partition, {})
            if label not in of_number:
                of_number[label] = tables[where] = DedupTable()
            elif self.scope is DedupScope.PRIORITY:
                raise ConfigurationError(
                    f"two loaded topics end in .{label} (partition {partition}): "
                    f"the changelog {self.changelog} cannot tell their keys apart"
                )
            else:
                tables[where] = of_number[label]
        timeout = self._timeout_s if timeout_s is None else timeout_s
        user = self._conf.get("sasl.username")
        restore = _Restore(self.changelog, by_number, timeout, self._clock, user=user)
        return Restoring(self, restore, tables)

    def unload(self, partitions: Sequence[Where]) -> None:
        for where in partitions:
            self.drop(where)

    def restore_consumers(self) -> tuple[Consumer, Consumer]:
        """A restore's reader, and the consumer that finds the ends it reads to."""
        log_end = client(self._consumer_factory, {**self.restore_conf(), **_LOG_END})
        try:
            return client(self._consumer_factory, self.restore_conf()), log_end
        except BaseException:
            log_end.close()  # else its threads and connections stay, at every attempt
            raise

    def restore_conf(self) -> dict[str, Any]:
        """librdkafka options of the restore consumer: ``conf`` and what a restore needs."""
        return {
            # What librdkafka holds of a restore's records: fetched records cost it a few
            # hundred bytes each once decompressed, and the changelog's records are small and
            # lz4-compressed, so its own limits (50 MB a fetch, 64 MB queued, both counted
            # compressed) let it hold about 400 MB for a million keys, more than their table.
            # These bounds keep a restore of a million keys under 100 MB above its table.
            "max.partition.fetch.bytes": 1024 * 1024,
            "fetch.max.bytes": 4 * 1024 * 1024,
            "queued.max.messages.kbytes": 4 * 1024,
            "queued.min.messages": 10_000,
            # Once a partition's queue is past those bounds librdkafka waits this long before
            # its next fetch: its default of 1 s made the fetch of a million keys take 14 s
            # where 10 ms take 5 s, for the same memory.
            "fetch.queue.backoff.ms": 10,
            **self._conf,
            "group.id": f"{self.changelog}.restore",  # required; never joined or committed
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            # A start that moves under the read (records deleted: `compact,delete`, or
            # DeleteRecords) goes on from the new start; librdkafka's default jumps to the end,
            # which would end the restore there with the keys after it missing.
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",  # records of aborted transactions never count
            # The end of a transactional partition is a commit marker, seen as EOF only by the
            # next fetch: do not let the broker hold that fetch for the default 500 ms.
            "fetch.wait.max.ms": 20,
        }


class Restoring:
    """A load of :class:`KafkaDedupStore` in steps (see :meth:`KafkaDedupStore.restoring`)."""

    def __init__(self, store: KafkaDedupStore, restore: _Restore, tables: dict[Where, DedupTable]):
        self._store = store
        self._restore = restore
        self._tables = tables

    def read(self) -> None:
        """Read the changelog into the new tables (any thread: it touches nothing shared)."""
        if self._restore.by_number:
            self._restore.run(*self._store.restore_consumers())

    def install(self, partitions: Sequence[Where]) -> None:
        """Make the tables read those of ``partitions`` (the others read are dropped)."""
        for where, table in self._tables.items():
            if where in partitions:
                self._store.install(where, table)

    def cancel(self) -> None:
        """End a :meth:`read` under way soon (as timed out): its result is not wanted."""
        self._restore.cancelled.set()


class _Restore:
    """One restore: a consumer, a deadline, and the changelog partitions not read to their end."""

    def __init__(
        self,
        topic: str,
        by_number: dict[int, dict[str, DedupTable]],
        timeout: float,
        clock: Callable[[], int],
        *,
        user: str | None = None,
    ) -> None:
        self.topic = topic
        self.by_number = by_number
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.clock = clock
        self.ends: dict[int, int] = {}
        """Changelog partitions still to read -> their end (log end offset) at the start."""
        self.read: dict[int, int] = {}
        self.malformed = 0
        self.first_malformed = ""
        self.user = user
        """The SASL user reading, named when Kafka refuses it."""
        self.cancelled = threading.Event()

    def run(self, consumer: Consumer, log_end: Consumer) -> None:
        """Read with ``consumer`` into the tables, to the ends ``log_end`` (a read_uncommitted
        consumer) finds; both are closed afterwards."""
        try:
            try:
                self._find_ends(log_end)
            finally:
                log_end.close()
            self._read(consumer)
        finally:
            consumer.close()
        if self.malformed:
            _log.warning(
                "skipped %d malformed record(s) of %s while restoring deduplication state; "
                "first: %s",
                self.malformed,
                self.topic,
                self.first_malformed,
            )

    def _remaining(self) -> float:
        return 0.0 if self.cancelled.is_set() else self.deadline - time.monotonic()

    def _read(self, consumer: Consumer) -> None:
        if not self.ends:
            return
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self.ends])
        now = self.clock()
        ends, read, by_number = self.ends, self.read, self.by_number
        while ends:
            for message in consumer.consume(RESTORE_BATCH, RESTORE_POLL_S):
                error = message.error()
                if error is not None:
                    self._on_error(message.partition(), message.offset(), error)
                    continue
                partition, offset = message.partition() or 0, message.offset() or 0
                end = ends.get(partition)
                if end is None:
                    continue  # a partition already read to its end
                try:
                    restore_record(by_number[partition], message.key(), message.value(), now)
                except ValueError as exc:
                    self.malformed += 1
                    if self.malformed == 1:
                        self.first_malformed = f"partition {partition} offset {offset}: {exc}"
                read[partition] = offset + 1
                if offset + 1 >= end:
                    del ends[partition]
            if ends and self._remaining() <= 0:
                raise self._timed_out()

    def _find_ends(self, consumer: Consumer) -> None:
        """The end of each changelog partition to read; an empty one is read already."""
        for partition in sorted(self.by_number):
            low, high = self._watermarks(consumer, partition)
            if high > low:
                self.ends[partition] = high

    def _watermarks(self, consumer: Consumer, partition: int) -> tuple[int, int]:
        """A changelog partition's low and high watermarks, asked again after a transient error
        (a partition whose leader is moving or just elected) until the deadline."""
        tp = TopicPartition(self.topic, partition)
        missing_until = time.monotonic() + MISSING_GRACE_S
        while True:
            try:
                marks = consumer.get_watermark_offsets(
                    tp, timeout=max(0.1, min(WATERMARK_TRY_S, self._remaining()))
                )
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                transient = error.retriable() or error.code() in _TRANSIENT
                # A topic just created is unknown to the client's metadata for a moment.
                missing = error.code() in _MISSING
                if missing and time.monotonic() >= missing_until:
                    raise self._refused(partition, error) from exc
                if not (missing or transient):
                    raise self._refused(partition, error) from exc
                marks = None
            if marks is not None:
                low, high = marks
                return int(low), int(high)
            if self._remaining() <= 0:
                self.ends = {p: -1 for p in self.by_number if p >= partition}
                raise self._timed_out()
            # An error without a leader comes back at once: no busy loop (on a helper thread
            # it would take the GIL from the worker's others).
            self.cancelled.wait(min(WATERMARK_PAUSE_S, self._remaining()))

    def _on_error(self, partition: int | None, offset: int | None, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF and partition is not None:
            # The end (last stable offset) that the broker shows the consumer now; short of the
            # log end seen at the start while a transaction there is open: keep reading then.
            if offset is not None and offset >= self.ends.get(partition, 0):
                self.ends.pop(partition, None)
            return
        if error.retriable() or error.code() in _TRANSIENT:
            _log.info("retrying after an error restoring %s: %s", self.topic, error.str())
            return
        raise self._refused(partition, error)

    def _refused(self, partition: int | None, error: KafkaError) -> DedupRestoreError:
        where = self.topic if partition is None else f"{self.topic} partition {partition}"
        hint = ""
        if error.code() in _MISSING:
            hint = (
                f"; the changelog topic {self.topic} does not exist, or has fewer partitions than "
                "the job topics: `pipeline topics apply` creates it or adds them"
            )
        elif error.code() in _NOT_AUTHORIZED:
            group = error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
            resource, name = ("GROUP", f"{self.topic}.restore") if group else ("TOPIC", self.topic)
            hint = f"; {not_authorized(resource, name, 'DESCRIBE' if group else 'READ', self.user)}"
        kind = ChangelogSetupError if hint else DedupRestoreError
        return kind(
            f"reading {where} to restore deduplication state failed: "
            f"{error.str()} ({error.name()}){hint}"
        )

    def _timed_out(self) -> DedupRestoreTimeoutError:
        where = ", ".join(
            f"{p} (at offset {self.read.get(p, 0)} of {end if end >= 0 else 'unknown'})"
            for p, end in sorted(self.ends.items())
        )
        return DedupRestoreTimeoutError(
            f"restoring deduplication state from {self.topic} did not finish within "
            f"{self.timeout:g}s; partition(s) left: {where}. Is Kafka reachable? A transaction "
            "left open by a crashed producer holds readers back until its transaction.timeout.ms"
        )


_LOG_END = {"isolation.level": "read_uncommitted"}
"""What the end query's consumer sees differently: the log end offset, open transactions in."""

WATERMARK_TRY_S = 5.0
"""How long one watermark request may wait before it is asked again (within the deadline)."""
WATERMARK_PAUSE_S = 0.1
"""The pause between a failed watermark request and the next."""
MISSING_GRACE_S = 3.0
"""How long a changelog partition may be unknown (fresh metadata) before it counts as missing."""

_TRANSIENT = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        KafkaError.REQUEST_TIMED_OUT,
        # A partition whose leader was just elected or is moving (a new topic, a broker
        # restart): librdkafka reports these from watermark requests without the retriable flag.
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)

_NOT_AUTHORIZED = frozenset(
    {KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED}
)
_MISSING = frozenset(
    {
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
    }
)
