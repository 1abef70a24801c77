"""One term as leader: read the deferred and wait-tier topics, release jobs when due, fire cron.

A session starts by fencing the previous leader (``init_transactions``), then reads the
scheduler state and the schedules, and assigns every source partition at its committed offset.
Each :meth:`LeaderSession.step` waits for the next due time or a new message (whichever comes
first; never longer than ``max_wait_s``), routes what arrived, releases what is due, fires cron,
and commits all of it with the consumed offsets and the progress records in one transaction.
The schedules and their fires are :mod:`._firing`'s; which message waits at the head of its
partition (paused) is :mod:`._heads`', and why a partition pauses is told by :mod:`._pauses`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from time import monotonic
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from pipeline._brokerhealth import BrokerHealth
from pipeline._codec import DeadLetterCodec
from pipeline._envelopes import job_codec, service_codec
from pipeline._errors import DecodeError
from pipeline._job import now_ms
from pipeline._newclient import client
from pipeline._producer import message_max_bytes
from pipeline._records import Schedule
from pipeline._registry import Registry
from pipeline._scheduletable import publish_schedules
from pipeline._settings import Settings
from pipeline._topics import TopicNames, deferred_group
from pipeline._topicspec import deferred_tier_topic
from pipeline._transactions import Headers, MessageTooLargeError, Tally

from ._cron import CronTable
from ._deadletter import DeadLetters
from ._duequeue import DueQueue
from ._firing import CronFiring
from ._heads import HeadWaits
from ._metrics import SchedulerMetrics
from ._partitions import PartitionWatch, term_partitions
from ._pauses import PauseLog
from ._progress import MAX_HELD, PartitionProgress, SavedProgress, record_room
from ._routing import HOLD, RELEASE, Router
from ._state import load_state, progress_key
from ._txn import leader_transactions

_log = logging.getLogger("pipeline.scheduler")

Where = tuple[str, int]
OFFSETS_INTERVAL_S = 1.0


class LeaderSession:
    """The leader's state and loop step; :meth:`close` ends the term (aborting what is open)."""

    def __init__(
        self,
        settings: Settings,
        metrics: SchedulerMetrics,
        schedules: list[Schedule],
        registry: Registry | None = None,
        serve: Callable[[float], None] | None = None,
        max_held: int = MAX_HELD,
    ) -> None:
        """``serve``: what the transaction loop does between attempts while Kafka is down
        (the runtime polls the leadership group; see :mod:`._txn`). ``max_held``: the most
        offsets of one partition a progress record names, written and read back (tests lower
        it)."""
        self.settings = settings
        self.metrics = metrics
        self._code_schedules = schedules
        sched = settings.scheduler
        ns = settings.namespace
        self.names = TopicNames(ns)
        self.router = Router(
            int(sched.horizon_s * 1000),
            tuple(int(d * 1000) for d in sched.wait_tiers_s),
            sched.release_lead_ms,
        )
        self._lead = sched.release_lead_ms
        self.tier_topics = [deferred_tier_topic(ns, i) for i in range(len(sched.wait_tiers_s))]
        self._tier_labels = [str(i) for i in range(len(self.tier_topics))]
        self.queue = DueQueue()
        self.progress: dict[Where, PartitionProgress] = {}
        self._max_held = max_held
        self._paused: set[Where] = set()
        self._pauses = PauseLog(self.names.scheduler_state, message_max_bytes(settings))
        self._codec = service_codec(job_codec(settings))  # cron fires never wait for it
        self._heads = HeadWaits(
            self.router, {topic: i for i, topic in enumerate(self.tier_topics)}, self._codec
        )
        self._dead_letters = DeadLetters(
            DeadLetterCodec(self._codec.store), message_max_bytes(settings), self.names.schedules
        )
        self._tally = Tally()
        """The counts of the open transaction (see :class:`Tally`)."""
        self.firing = CronFiring(
            CronTable(int(sched.misfire_grace_s * 1000), sched.max_catchup_fires),
            names=self.names,
            codec=self._codec,
            dead_letters=self._dead_letters,
            metrics=metrics,
            tally=self._tally,
            registry=registry,
            default_attempts=settings.producer.default_max_attempts,
        )
        self._batch_max = sched.batch_max
        self._max_wait_ms = int(sched.max_wait_s * 1000)
        self.txn = leader_transactions(settings, serve=serve)
        self._consumer: Consumer | None = None
        self._watch: PartitionWatch | None = None
        self._unsent: dict[Where, int] = {}
        self._offsets_sent = float("-inf")  # monotonic: a wall clock step delays nothing

    # --- start and stop --------------------------------------------------------------------

    def start(self) -> None:
        self.txn.init()  # fences the previous leader: from here on, only we commit
        if self._code_schedules:
            written = publish_schedules(self.settings, self._code_schedules)
            if written:
                _log.info("schedules published", extra={"schedules": ",".join(written)})
        state = load_state(self.settings, max_held=self._max_held)
        self.metrics.state_records_skipped.inc(state.skipped)
        self.firing.cron.load_last_fires(state.last_fires, state.catch_ups)
        conf: dict[str, Any] = {
            "group.id": deferred_group(self.settings),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 50,
            **BrokerHealth.of(self.settings.bootstrap_servers).callbacks(
                "scheduler deferred consumer"
            ),
            **self.settings.client_config(),
        }
        consumer = client(Consumer, conf)
        self._consumer = consumer
        sources = [self.names.deferred, *self.tier_topics]
        partitions = term_partitions(
            consumer,
            [*sources, self.names.schedules],
            self.settings.namespace,
            user=self.settings.security.sasl_username,
        )
        wanted = [TopicPartition(t, p) for t in sources for p in partitions[t]]
        self._watch = PartitionWatch(
            {t: len(partitions[t]) for t in [*sources, self.names.schedules]},
            every_s=self.settings.scheduler.partitions_check_s,
        )
        assignment = []
        for tp in consumer.committed(wanted, timeout=30):
            committed = tp.offset if tp.offset >= 0 else None
            where = (tp.topic, tp.partition)
            saved = state.progress.get(where)
            # Offsets are committed about once a second; the progress record of every
            # transaction is at least as recent, and everything below its watermark is done.
            if saved is not None and (committed is None or saved.watermark >= committed):
                committed = saved.watermark
            self.progress[where] = self.new_progress(where, committed, saved)
            start = committed if committed is not None else OFFSET_BEGINNING
            assignment.append(TopicPartition(tp.topic, tp.partition, start))
        schedules = [
            TopicPartition(self.names.schedules, p, OFFSET_BEGINNING)
            for p in partitions[self.names.schedules]
        ]
        if len(schedules) > 1:
            _log.warning(
                "%s has %d partitions (`pipeline topics apply` creates one): all are read, and "
                "a schedule written to two of them counts its newest record by timestamp",
                self.names.schedules,
                len(schedules),
            )
        self.firing.begin(
            {tp.partition: consumer.get_watermark_offsets(tp, timeout=30) for tp in schedules}
        )
        consumer.assign([*assignment, *schedules])
        _log.info(
            "leading",
            extra={"partitions": len(assignment), "saved_progress": len(state.progress)},
        )

    def new_progress(
        self, where: Where, committed: int | None = None, saved: SavedProgress | None = None
    ) -> PartitionProgress:
        """Partition ``where``'s progress; its record must fit in one message, with its key."""
        room = record_room(message_max_bytes(self.settings), len(progress_key(*where)))
        return PartitionProgress(committed, saved, self._max_held, room)

    def close(self) -> None:
        """End the term: abort an open transaction, drop what memory holds."""
        try:
            self.txn.close()
        finally:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            self.queue.clear()
            self._tally.drop()  # not committed: the next term releases and counts them again
            self.metrics.schedules_invalid.set(0)

    # --- the loop step ---------------------------------------------------------------------

    def next_wake(self) -> int | None:
        due = self.queue.next_due()
        release = due - self._lead if due is not None else None
        fire = self.firing.next_due()
        wakes = [w for w in (release, fire) if w is not None]
        wakes.extend(self._heads.wakes.values())
        return min(wakes) if wakes else None

    def partitions_changed(self) -> bool:
        """Whether a topic of the term gained partitions (see :mod:`._partitions`): the term
        must end, and the next one reads them all."""
        watch, consumer = self._watch, self._consumer
        return watch is not None and consumer is not None and watch.changed(consumer.list_topics)

    def step(self) -> None:
        consumer = self._consumer
        assert consumer is not None, "start() first"
        wake = self.next_wake()
        wait_ms = self._max_wait_ms
        if wake is not None:
            wait_ms = max(0, min(wait_ms, wake - now_ms()))
        first = consumer.poll(wait_ms / 1000)
        messages: list[Message] = []
        if first is not None:
            messages.append(first)
            messages.extend(consumer.consume(self._batch_max, 0))
        now = now_ms()
        for message in messages:
            self._handle(message, now)
        self._release(now_ms())
        self._unpark(now_ms())  # after the releases: they make room in a full partition
        if self.firing.caught_up(consumer):
            self.firing.fire(now_ms(), self.txn, self.settings.namespace)
        self._commit()

    def _handle(self, message: Message, now: int) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                _log.warning("consumer error", extra={"error": error.str()})
            return
        topic = message.topic()
        assert topic is not None
        if topic == self.names.schedules:
            self.firing.read(message)
            return
        where = (topic, message.partition() or 0)
        progress = self.progress[where]
        offset = message.offset() or 0
        progress.delivered(offset)
        if progress.parked or not self._heads.ready(where, progress, message, now):
            # Every later message of this partition waits behind it.
            if where not in self._paused:
                self._pause(where, progress)
            progress.parked.append(message)
            return
        self._process(message, where, progress, now)

    def _pause(self, where: Where, progress: PartitionProgress) -> None:
        self._pauses.paused(where, progress)
        assert self._consumer is not None
        self._consumer.pause([TopicPartition(*where)])
        self._paused.add(where)

    def _process(
        self, message: Message, where: Where, progress: PartitionProgress, now: int
    ) -> None:
        offset = message.offset() or 0
        if progress.finished_before(offset):
            progress.processed(offset)  # released or moved by a committed transaction
            return
        value = message.value() or b""
        try:
            job = self._codec.decode(value)
        except DecodeError as exc:
            self._dead_letter(message, exc)
            progress.processed(offset)
            return
        due = job.not_before or 0
        decision = self.router.route(due, now)
        key = message.key()
        headers = message.headers()
        if decision == RELEASE:
            if self._send(self.names.jobs(job.priority), value, key, headers, where, offset):
                self._tally.add(self.metrics.releases.inc)
                self._tally.add(
                    self.metrics.lateness.observe, max(0, now + self._lead - due) / 1000
                )
        elif decision == HOLD:
            target = self.names.jobs(job.priority)
            self.queue.push(due, where, offset, target, key, value, headers, job.id)
            progress.hold(offset)
        elif self._send(self.tier_topics[decision], value, key, headers, where, offset):
            self._tally.add(self.metrics.tier_moves.labels(self._tier_labels[decision]).inc)
        progress.processed(offset)

    def _send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: Headers,
        where: Where,
        offset: int,
    ) -> bool:
        """Write a delayed job on to ``topic``; False when the producer refused it as too
        large, and its dead letter went instead."""
        try:
            self.txn.produce(topic, value, key, headers=headers, too_large_raises=True)
        except MessageTooLargeError:
            job = self._codec.decode(value)  # decoded before: only its size is wrong
            letter = self._dead_letters.too_large(job, where, offset, key, len(value))
            self.txn.produce(self.names.dlq, letter, self._dead_letters.key(key))
            self._tally.add(self.metrics.dead_letters.inc)
            return False
        return True

    def _unpark(self, now: int) -> None:
        ready = self._heads.ready
        for where in list(self._paused):
            progress = self.progress[where]
            parked = progress.parked
            while parked and ready(where, progress, parked[0], now):
                self._process(parked.popleft(), where, progress, now)
            if not parked and progress.may_resume:
                assert self._consumer is not None
                # resume() fetches after the last message delivered, i.e. after the parked ones.
                self._consumer.resume([TopicPartition(*where)])
                self._paused.discard(where)

    def _release(self, now: int) -> None:
        send = self._send
        observe = partial(self._tally.add, self.metrics.lateness.observe)
        lead = self._lead
        released = self.queue.pop_due(now + lead, self._batch_max)
        sent = 0
        for job in released:
            if send(job.target, job.value, job.key, job.headers, job.source, job.offset):
                sent += 1
                observe(max(0, now_ms() + lead - job.due_ms) / 1000)
            self.progress[job.source].release(job.offset)
        if sent:
            self._tally.add(self.metrics.releases.inc, sent)

    def _dead_letter(self, message: Message, exc: DecodeError) -> None:
        letter = self._dead_letters.encode(message, exc)
        self.txn.produce(self.names.dlq, letter, self._dead_letters.key(message.key()))
        self._tally.add(self.metrics.dead_letters.inc)
        _log.warning("undecodable deferred message dead-lettered", extra={"reason": exc.reason})

    def _commit(self) -> None:
        now = monotonic()
        if not self.txn.open:
            if not self._offsets_due(now):
                return
            # Nothing else to commit, but offsets the last transactions left unsent: without
            # this they waited for the next release or move (a minute, with only far jobs),
            # and the deferred group's lag stayed up meanwhile.
            self.txn.begin()
        offsets = []
        state_topic = self.names.scheduler_state
        for where, progress in self.progress.items():
            if not progress.dirty:
                continue
            saved = progress.saved()
            if saved is None:
                continue
            self.txn.produce(state_topic, saved.encode(), progress_key(*where))
            self._unsent[where] = saved.watermark
        # Sending offsets costs a round trip to the group coordinator (about 100 ms on a busy
        # single node), and the progress records above already make the transaction exact, so
        # offsets ride along about once a second (they spare a new leader re-reading).
        if self._offsets_due(now):
            offsets = [TopicPartition(t, p, w) for (t, p), w in self._unsent.items()]
            self._unsent.clear()
            self._offsets_sent = now
        assert self._consumer is not None
        self.txn.commit(offsets, self._consumer.consumer_group_metadata())
        for progress in self.progress.values():
            progress.dirty = False
        self.metrics.transactions.inc()
        self._tally.committed()

    def _offsets_due(self, now: float) -> bool:
        """Whether offsets wait and the last were sent long enough ago (by ``monotonic()``)."""
        return bool(self._unsent) and now - self._offsets_sent >= OFFSETS_INTERVAL_S

    # --- read-outs -------------------------------------------------------------------------

    @property
    def held(self) -> int:
        return len(self.queue)

    @property
    def parked(self) -> int:
        return sum(len(self.progress[w].parked) for w in self._paused)
