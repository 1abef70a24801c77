"""A term's cron side: read ``<ns>.schedules`` into the cron table, then fire what is due.

Nothing fires before the schedules topic is read up to where it ended when the term began
(:meth:`CronFiring.caught_up`): a schedule deleted or paused meanwhile must not fire once more.
``pipeline topics apply`` gives the topic one partition; one created otherwise (a cluster that
creates topics on first write, with several partitions) is read whole, and which record of a
schedule wins is :class:`pipeline._tablereader.Newest`'s rule.
Each fire goes into the term's open transaction with the schedule's last fire on
``<ns>.scheduler-state``, so a fire and its record commit together or not at all. A fire too
large to send is dead-lettered (``too_large``) instead: refused, it would abort every
transaction of every term.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import Consumer, Message, TopicPartition

from pipeline._codec import JobCodec, ScheduleCodec
from pipeline._cronstate import cron_key, encode_last_fire
from pipeline._registry import Registry
from pipeline._schedule import decode_schedule, fire_job
from pipeline._tablereader import Newest
from pipeline._topics import TopicNames
from pipeline._transactions import MessageTooLargeError, Tally, Transactions

from ._cron import CronTable
from ._deadletter import DeadLetters
from ._metrics import SchedulerMetrics

_log = logging.getLogger("pipeline.scheduler")


class CronFiring:
    """The cron table of a term, fed from ``<ns>.schedules``, and its fires."""

    def __init__(
        self,
        cron: CronTable,
        *,
        names: TopicNames,
        codec: JobCodec,
        dead_letters: DeadLetters,
        metrics: SchedulerMetrics,
        tally: Tally,
        registry: Registry | None,
        default_attempts: int,
    ) -> None:
        self.cron = cron
        self.ready = False
        """Whether the schedules topic was read to its end at the term's start."""
        self._ends: dict[int, int] = {}
        """Per partition of ``<ns>.schedules`` not read yet: where it ended when the term began."""
        self._names = names
        self._codec = codec
        self._schedule_codec = ScheduleCodec(codec.store)
        self._dead_letters = dead_letters
        self._metrics = metrics
        self._tally = tally
        """The fires of the open transaction, counted once it commits."""
        self._registry = registry  # the job types' declared options, for the fires
        self._default_attempts = default_attempts
        self._newest: Newest[Message] = Newest()
        """Each schedule's records that may win, and which does."""
        self._where: dict[str, tuple[int, int]] = {}
        """Per schedule: the partition and offset of its winning record (for a dead letter)."""

    def begin(self, offsets: Mapping[int, tuple[int, int]]) -> None:
        """A term starts with each partition of ``<ns>.schedules`` holding offsets ``low`` to
        ``high`` (``offsets``, by partition): nothing fires before the read reaches every
        ``high`` (at once if the topic holds nothing)."""
        self._ends = {p: high for p, (low, high) in offsets.items() if high > low}
        self.ready = not self._ends

    def next_due(self) -> int | None:
        """When the next fire is due (None: no schedule, or the schedules are not read yet)."""
        return self.cron.next_due() if self.ready else None

    def caught_up(self, consumer: Consumer) -> bool:
        """Whether ``<ns>.schedules`` is read up to where it ended when the term began.

        The consumer's position, not the offset of the last record seen: a topic written in
        transactions ends with a marker (or aborted records) that a read_committed consumer
        steps over but never receives."""
        if not self.ready:
            topic = self._names.schedules
            wheres = [TopicPartition(topic, p) for p in self._ends]
            for where in consumer.position(wheres):
                if where.offset >= self._ends[where.partition]:
                    del self._ends[where.partition]
            self.ready = not self._ends
        return self.ready

    def read(self, message: Message) -> None:
        """A record of ``<ns>.schedules``: a schedule put, replaced or (a tombstone) removed."""
        raw_key = message.key()
        if not raw_key:
            return
        name = raw_key.decode(errors="replace")
        partition = message.partition() or 0
        won = self._newest.add(name, message, partition, message.timestamp()[1])
        self._where[name] = (won.partition() or 0, won.offset() or 0)
        value = won.value()
        if value is None:
            self.cron.put(name, None)
        else:
            self.cron.put_record(decode_schedule(name, value, self._schedule_codec))
        self._metrics.schedules_invalid.set(len(self.cron.invalid))

    def fire(self, now: int, txn: Transactions, namespace: str) -> None:
        """Every fire due at ``now``, and the schedules removed, into ``txn``."""
        state_topic = self._names.scheduler_state
        for fire in self.cron.due(now):
            schedule = fire.schedule
            if fire.fire_ms is not None:
                registered = self._registry.find(schedule.job_type) if self._registry else None
                job = fire_job(
                    schedule,
                    namespace,
                    fire.fire_ms,
                    self._default_attempts,
                    registered.options if registered is not None else None,
                )
                key = (job.idempotency_key or "").encode()
                value = self._codec.encode(job)
                try:
                    topic = self._names.jobs(job.priority)
                    txn.produce(topic, value, key, too_large_raises=True)
                except MessageTooLargeError:  # refused, it would abort every transaction
                    where = self._where.get(schedule.name, (0, -1))
                    letter = self._dead_letters.fire_too_large(
                        job, schedule.name, where, len(value)
                    )
                    txn.produce(self._names.dlq, letter, key)
                    self._tally.add(self._metrics.dead_letters.inc)
                else:
                    self._tally.add(self._metrics.cron_fires.labels(schedule.name).inc)
                    _log.info(
                        "cron fire",
                        extra={
                            "schedule": schedule.name,
                            "fire_ms": fire.fire_ms,
                            "job_id": job.id,
                        },
                    )
            state = encode_last_fire(fire.last_ms, fire.until_ms)
            txn.produce(state_topic, state, cron_key(schedule.name))
        for name in self.cron.removed:
            txn.produce(state_topic, None, cron_key(name))
        self.cron.removed.clear()
        self._metrics.schedules_invalid.set(len(self.cron.invalid))
