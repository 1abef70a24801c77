"""The consumer thread: the only thread that calls the Kafka consumer.

confluent-kafka serializes calls on one client: a ``pause()`` from another thread waits until a
blocking ``poll()`` returns. So one thread owns the consumer and does everything with it: poll,
hand batches to the event loop, pause full partitions and resume drained ones, commit, react
to rebalances, measure lag, detect the end of a burst run. The event loop talks back only by
writing fields of :class:`PartitionState` (each with one writer) and a few flags.

Polling never stops while jobs run (a job longer than ``max.poll.interval.ms`` causes no
rebalance). ``poll(timeout)`` waits for the first message, then ``consume(n, 0)`` takes what is
already fetched without waiting (``consume(n, timeout)`` would wait the whole timeout for a
full batch and ruin latency). After handing a batch it polls again at once (``CHORES_S``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from pipeline import Priority, Settings
from pipeline._acls import Role
from pipeline._authfailure import authentication_error
from pipeline._brokerhealth import BrokerHealth
from pipeline._clientlog import is_fatal
from pipeline._dedup import DedupScope
from pipeline._dedupstores import DedupStore
from pipeline._errors import ConfigurationError, PipelineError
from pipeline._groupadmin import ENSURE_TIMEOUT_S, ensure_group_configs
from pipeline._newclient import client
from pipeline._ratelog import RateLimitedLog
from pipeline._topics import moved_to
from pipeline._writecheck import check_writes

from .._metrics import WorkerMetrics
from .._work import PartitionState
from ..commit.committer import Committer
from ..commit.moves import Mover
from ..recovery.poison import PoisonPillError, PoisonSide, PoisonWatch
from .assignment import Assignment, Slots
from .burst import BurstWatch, EmptyJoin
from .cluster import ClusterView
from .config import consumer_config
from .flow import FlowControl
from .groupproto import copartitioning_problem, incremental
from .handover import Handover
from .loopside import Batch, LoopSide
from .rebalance import Rebalance
from .shutdown import close_clients, final_commit

_log = logging.getLogger("pipeline.worker.consumer")

POLL_TIMEOUT_S = 0.05
"""Longest blocking poll: bounds how late the thread notices flags, commits and burst ends."""
MIN_CHECK_S = 1.0
"""The least time the start's check of the topics it writes waits for Kafka, when setting the
group configs took the start's budget (``ENSURE_TIMEOUT_S``): Kafka is down then."""
PAUSED_POLL_TIMEOUT_S = 0.005
"""Poll timeout while a partition is paused, so it resumes soon after its buffer drains (and
while poison-pill detection withholds messages, so they go on soon after they may)."""
MEMBER_ID_S = 1.0
"""How often the group member id (:attr:`ConsumerThread.member_id`) is read again."""
CHORES_S = 0.005
"""How long the work besides polling (assignments, resumes, moves, poison leases, commits, lag)
may wait after a batch is handed. Done at once, it held the GIL while the event loop, then the
pool thread that runs the job, waited for it: a job started about 0.1 ms later."""
LEASE_BATCHES = 2
"""Poison-pill leases: offsets handed ahead of the last commit, in ``consume_batch`` units."""
MAX_WINDOW = 256
"""The largest group of suspects a quarantine runs at once (at most the concurrency)."""


class ConsumerThread:
    """Owns the consumer; see the module docstring."""

    def __init__(
        self,
        *,
        settings: Settings,
        group_id: str,
        topics: dict[str, tuple[Priority, int]],
        side: LoopSide,
        metrics: WorkerMetrics,
        mover: Mover | None = None,
        dedup: DedupStore | None = None,
        consumer_factory: Callable[[dict[str, Any]], Consumer] = Consumer,
        unwritten: Sequence[str] = (),
    ) -> None:
        """``unwritten``: topics of the worker's role this one never writes (the changelog
        beside an application's own dedup store), left out of the check at start."""
        worker = settings.worker
        self._dedup = dedup
        self._unwritten = unwritten
        self._topics = topics
        self._side = side
        self._metrics = metrics
        self._batch = worker.consume_batch
        self._burst = worker.burst
        self._settings = settings
        conf = consumer_config(settings, group_id)
        problem = copartitioning_problem(conf)
        if worker.dedup_scope is DedupScope.NAMESPACE and len(topics) > 1 and problem:
            raise ConfigurationError(problem)
        # Polled every few ms: it reports the cluster's reachability once a second.
        self.health = BrokerHealth.of(settings.bootstrap_servers)
        conf.update(self.health.callbacks("consumer", on_error=self._on_error, stats=True))
        self._mover = mover
        self._committer = Committer(
            metrics,
            interval_s=worker.commit_interval_s,
            every=worker.commit_every,
            mover=mover,
            metadata_limit=worker.offset_metadata_max_bytes,
        )
        conf["on_commit"] = self._committer.on_commit
        self._consumer = client(consumer_factory, conf)
        self.states: dict[tuple[str, int], PartitionState] = {}
        self._poison_side = side if isinstance(side, PoisonSide) else None
        self._poison = PoisonWatch(
            deliveries=worker.poison_deliveries,
            lease=LEASE_BATCHES * worker.consume_batch,
            window=min(worker.concurrency, MAX_WINDOW),
            consumer=self._consumer,
            committer=self._committer,
            states=self.states,
            metrics=metrics,
            deliver=self._deliver,
            dead_letter=self._dead_letter if self._poison_side is not None else None,
        )
        self._flow = FlowControl(self._consumer, self.states, worker.buffer_size, metrics)
        self._committer.attach(self._consumer, self.states, self._poison.guards, self._flow.hold)
        self._cluster = ClusterView(
            self._consumer, topics, self.states, metrics, settings.namespace, health=self.health,
            written=moved_to(settings),
        )  # fmt: skip
        shared = worker.dedup_scope is DedupScope.NAMESPACE
        slots = Slots(list(topics), self.states, self._cluster.partition_counts)
        self.assignment = Assignment(
            self._consumer,
            self.states,
            self._poison,
            flow=self._flow,
            mover=mover,
            dedup=dedup,
            slots=slots if shared and len(topics) > 1 else None,
        )
        """Newly assigned partitions, paused until their marks and keys are read back."""
        self._handover = Handover(
            states=self.states,
            assignment=self.assignment,
            flow=self._flow,
            poison=self._poison,
            cluster=self._cluster,
            deliver=self._deliver,
            on_fatal=self._on_error,
            group=group_id,
            user=settings.security.sasl_username,
        )
        self._burst_watch = BurstWatch(
            self._consumer, self._committer, self.states, self._cluster.known_partition_counts
        )
        self._empty_join = EmptyJoin(settings, group_id, self._consumer)
        self.rebalance = Rebalance(
            topics=topics,
            states=self.states,
            side=side,
            metrics=metrics,
            flow=self._flow,
            assignment=self.assignment,
            cluster=self._cluster,
            committer=self._committer,
            poison=self._poison,
            mover=mover,
            grace_s=worker.revoke_grace_s,
            txn_commit_after_s=worker.transaction_timeout_ms / 2000,
            incremental=incremental(conf),
            drain_moves=self._drain_moves,
            notify=self._notify,
        )
        """The group's assignments, revocations and losses."""
        self.intake_stopped = False
        """Set by the loop at shutdown: pause everything, hand nothing more."""
        self.stop_requested = False
        """Set by the loop when jobs are done: commit synchronously, close, exit."""
        self.last_poll = time.monotonic()
        self.reading_back = False
        """Reading back newly assigned partitions on this thread (their commit marks: up to
        ``READ_MARKS_S``), which holds its polls; not their keys' restore (a helper thread)."""
        self.member_id = ""
        """The consumer's group member id, as of its last chores ("": not joined yet); read by
        the heartbeats from the loop (``memberid()`` itself waits for this thread's poll)."""
        self._member_at = 0.0
        self._errors = RateLimitedLog(_log, interval_s=10.0)
        self._thread = threading.Thread(target=self._main, name="pipeline-consumer", daemon=True)
        self.done = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    @property
    def paused_full(self) -> int:
        """Owned partitions paused because their buffer is full (any thread may read it); not
        those paused until read back, held for their offset map, or at shutdown."""
        return len(self._flow.paused)

    # -- the thread ----------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            # Under the consumer protocol the group's session timeout is a group config: set
            # before joining, so that this member's first session has it already.
            started = time.monotonic()
            ensure_group_configs(self._settings)
            # Before the first job: a topic it may not write would stop it at a job's move.
            left = ENSURE_TIMEOUT_S - (time.monotonic() - started)
            check_writes(
                self._settings, Role.WORKER, timeout=max(MIN_CHECK_S, left), unused=self._unwritten
            )
            self._notify(self._side.on_checked)
            rebalance = self.rebalance
            self._consumer.subscribe(
                list(self._topics),
                on_assign=rebalance.on_assign,
                on_revoke=rebalance.on_revoke,
                on_lost=rebalance.on_lost,
            )
            # Under the consumer protocol a subscription to a topic that does not exist reports
            # no error (the classic one does): ask the cluster once after the first poll.
            self._cluster.topic_missing(time.monotonic())
            self._loop()
            self._final_commit()
        except PipelineError as exc:  # says what to do: no traceback
            self._notify(self._side.on_consumer_failed, exc)
        except BaseException as exc:
            _log.exception("the consumer thread failed: %s", exc)
            self._notify(self._side.on_consumer_failed, exc)
        finally:
            self.rebalance.closing = True
            self.assignment.close()  # a restore of keys still running is not waited for
            close_clients(self._consumer, self._mover)
            self.done.set()

    def _loop(self) -> None:
        consumer = self._consumer
        poll = consumer.poll
        consume = consumer.consume
        batch_size = self._batch - 1
        paused = self._flow.paused
        poison = self._poison
        chores_at = time.monotonic()
        behind = False  # a batch was handed since the chores were last done
        while not self.stop_requested:
            if self.intake_stopped:
                self._flow.pause_all()
            timeout = PAUSED_POLL_TIMEOUT_S if paused or poison.busy else POLL_TIMEOUT_S
            if behind:
                timeout = min(timeout, max(0.0, chores_at + CHORES_S - time.monotonic()))
            msg = poll(timeout)
            now = time.monotonic()
            self.last_poll = now
            if msg is not None:
                messages = [msg]
                if batch_size:
                    messages += consume(batch_size, 0)
                self._hand(messages)
                behind = now - chores_at < CHORES_S
                if behind:
                    continue  # poll at once: the loop takes the GIL meanwhile
            behind = False
            chores_at = now
            self._chores(now, idle=msg is None)

    def _chores(self, now: float, *, idle: bool) -> None:
        """What the thread does besides polling; ``idle``: the last poll came back empty."""
        if self.health.refusal is not None:  # credentials refused: no retry helps, stop
            raise authentication_error(self._settings, self.health.refusal)
        cluster = self._cluster
        committer = self._committer
        # Requests that block for their timeout while Kafka is unreachable wait for it.
        reachable = not self.health.down
        if reachable and self.assignment.due():
            # A restore of idempotency keys waits for every transaction open on the changelog
            # partitions it reads (route/changelog.py): ours is committed before one starts
            # (on a helper thread: polls and commits go on), else it waits for the next poll.
            committer.land()
            if committer.in_transaction:
                committer.commit(
                    self.states.values(), now, sync=True, finished=self._side.finished_jobs
                )
            if not committer.in_transaction:
                self.reading_back = True
                try:
                    early = self.assignment.load(resume=not self.intake_stopped)
                finally:
                    self.reading_back = False
                if early:
                    self._hand(early, held=True)
        if self._flow.paused and not self.intake_stopped:
            self._flow.resume_drained()
        if committer.in_transaction or not committer.awaiting(now):
            # Else the transaction opens once that commit is answered. Not waiting for the
            # moves' commit in flight: the next turn writes what it holds back.
            self._drain_moves(wait=False)
        self._poison.step(stopped=self.intake_stopped)
        if committer.due(now, self._side.finished_jobs):
            committer.commit(self.states.values(), now, finished=self._side.finished_jobs)
        cluster.check_topics(now)
        if reachable:
            cluster.check_written(now)
        self._read_member_id(now)
        if reachable and cluster.share_due(now):  # the burst check needs the counts too
            self._update_share()
        cluster.update_lag(now)
        if idle and self._burst and not self.intake_stopped:
            self._burst_turn(now, reachable=reachable)

    def _burst_turn(self, now: float, *, reachable: bool) -> None:
        """An idle turn of a burst run: done once the member has joined and all is drained."""
        if not self.rebalance.assigned_once:
            # No callback tells a member given no partition under the consumer protocol.
            if reachable and self._empty_join.joined(now):
                self.rebalance.joined_empty()  # drained or not: asked at the next turn
            return
        if self._burst_watch.drained(now):
            self._burst = False
            self._notify(self._side.on_burst_drained)

    def _read_member_id(self, now: float) -> None:
        """Read :attr:`member_id` again, every :data:`MEMBER_ID_S` once the group assigned."""
        if now >= self._member_at and self.rebalance.assigned_once:
            self._member_at = now + MEMBER_ID_S
            self.member_id = self._consumer.memberid() or self.member_id

    def _final_commit(self) -> None:
        """Commit every owned partition before closing (see :func:`.shutdown.final_commit`)."""
        final_commit(
            self._committer,
            self.states,
            self.health,
            moves=self._mover is not None,
            drain_moves=self._drain_moves,
            poll=self._poll_during_final_commit,
        )

    def _poll_during_final_commit(self, timeout: float) -> None:
        msg = self._consumer.poll(timeout)
        if msg is not None:
            self._hand([msg])  # counted as handed: never committed past by position

    def _hand(self, messages: list[Message], *, held: bool = False) -> None:
        """Hand a batch to the loop (see :meth:`.handover.Handover.hand`)."""
        self._handover.hand(messages, held=held)

    def _deliver(self, batch: Batch) -> None:
        """Hand messages withheld by poison-pill detection (counted as handed already)."""
        self._notify(self._side.on_batch, batch)

    def _dead_letter(self, state: PartitionState, message: Message, error: PoisonPillError) -> None:
        """Have the loop dead-letter a poison pill instead of running it."""
        assert self._poison_side is not None
        self._notify(self._poison_side.on_poison, state, message, error)

    def _notify(self, callback: Callable[..., Any], *args: Any) -> None:
        # A closed loop (RuntimeError) means the worker is exiting: nothing to tell it.
        with contextlib.suppress(RuntimeError):
            self._side.loop.call_soon_threadsafe(callback, *args)

    # -- moves -----------------------------------------------------------------

    def _drain_moves(self, *, wait: bool = True) -> None:
        mover = self._mover
        if mover is None:
            return
        states = self.states
        mover.drain(
            lambda where: where in states, functools.partial(_commit_point, states), wait=wait
        )

    def _update_share(self) -> None:
        """Tell the loop how many partitions of each topic it owns, of how many in all."""
        owned, total = self._cluster.share()
        self._notify(self._side.on_share, owned, total)

    # -- errors --------------------------------------------------------------------------------

    def _on_error(self, error: KafkaError) -> None:
        if is_fatal(error):
            _log.error("fatal consumer error: %s", error.str())
            self._notify(self._side.on_consumer_failed, KafkaException(error))
            self.stop_requested = True
            return
        self._errors.warning("client", "Kafka client error: %s", error.str())


def _commit_point(states: Mapping[tuple[str, int], PartitionState], where: tuple[str, int]) -> int:
    """Where ``where``'s commit point is now (-1: not ours): the loop's, or until the loop has
    finished a job of this assignment, the committed offset it started from (moves restored
    from the previous owner's mark are above that one)."""
    state = states.get(where)
    return -1 if state is None else max(state.commit_offset, state.committed)
