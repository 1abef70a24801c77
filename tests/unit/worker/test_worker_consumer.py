"""The consumer thread's bookkeeping against a fake consumer: pauses, commits, revokes, bursts."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from pipeline import NotAuthorizedError, Priority, Settings
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._work import PartitionState
from pipeline_worker.commit import committer as committer_module
from pipeline_worker.commit.marks import CommitMark
from pipeline_worker.commit.moves import Mover
from pipeline_worker.intake import consumer as consumer_module
from pipeline_worker.intake.burst import SAY_AFTER_S
from pipeline_worker.intake.config import consumer_config
from pipeline_worker.intake.consumer import CHORES_S, ConsumerThread
from pipeline_worker.route.policy import Record

from ..test_transactions import FakeProducer

TOPIC = "ns.jobs.default"


class FakeConsumer:
    """Records what the consumer thread asks of librdkafka."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.paused: set[tuple[str, int]] = set()
        self.positions: dict[tuple[str, int], int] = {}
        self.commits: list[tuple[bool, list[tuple[str, int, int]]]] = []
        self.sent: list[list[TopicPartition]] = []
        """What each commit sent, metadata included."""
        self.unassigned: list[tuple[str, int]] = []
        self.assignments: list[list[tuple[str, int]]] = []
        """Whole assignments (an eager rebalance)."""
        self.partitions = 2
        self.ends: dict[tuple[str, int], tuple[int, int]] = {}
        """(low, high) watermarks; partitions not listed are empty."""
        self.group_committed: dict[tuple[str, int], int] = {}
        self.watermark_queries: list[tuple[str, int]] = []
        self.watermark_calls: list[tuple[str, int, bool]] = []
        """Each watermark query's partition and whether it was ``cached``."""
        self.cached_ends: dict[tuple[str, int], tuple[int, int]] = {}
        """What librdkafka's cache answers (``cached=True``) where it differs from ``ends``:
        it learns a high watermark only from fetch responses."""
        self.unanswered: set[tuple[str, int]] = set()
        """Partitions whose leader does not answer an uncached query (it times out)."""
        self.topic_lists: list[str] = []
        """Each ``list_topics`` request's topic."""
        self.member: str | None = None
        """What ``memberid()`` answers (None: not joined)."""

    def memberid(self) -> str | None:
        return self.member

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001)
            )
            for tp in tps
        ]

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        self.commits.append((asynchronous, [(tp.topic, tp.partition, tp.offset) for tp in offsets]))
        self.sent.append(offsets)
        for tp in offsets:
            self.group_committed[(tp.topic, tp.partition)] = tp.offset
        return offsets

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [
            TopicPartition(
                tp.topic, tp.partition, self.group_committed.get((tp.topic, tp.partition), -1001)
            )
            for tp in tps
        ]

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = 0, cached: bool = False
    ) -> tuple[int, int]:
        where = (tp.topic, tp.partition)
        self.watermark_queries.append(where)
        self.watermark_calls.append((tp.topic, tp.partition, cached))
        if cached and where in self.cached_ends:
            return self.cached_ends[where]
        if cached and where not in self.ends:
            return OFFSET_INVALID, OFFSET_INVALID  # nothing fetched: librdkafka knows none
        if not cached and where in self.unanswered:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out"))
        return self.ends.get(where, (0, 0))

    def list_topics(self, topic: str, timeout: float) -> Any:
        self.topic_lists.append(topic)
        partitions = dict.fromkeys(range(self.partitions))
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions=partitions)})

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        self.unassigned += [(tp.topic, tp.partition) for tp in tps]

    def unassign(self) -> None:
        self.unassigned.append(("everything", -1))

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assignments.append([(tp.topic, tp.partition) for tp in tps])


class FakeSide:
    """The event loop side, on a real loop in a thread (revocation waits for it)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.batches: list[Any] = []
        self.revoked: list[tuple[list[PartitionState], bool]] = []
        self.drained = threading.Event()
        self.finished_jobs = 0
        self.shares: list[tuple[dict[str, int], dict[str, int]]] = []

    def on_batch(self, batch: Any) -> None:
        self.batches.append(batch)

    def on_assigned(self, states: list[PartitionState]) -> None:
        return None

    def on_share(self, owned: dict[str, int], total: dict[str, int]) -> None:
        self.shares.append((owned, total))

    async def revoke(self, states: list[PartitionState], *, lost: bool) -> None:
        self.revoked.append((states, lost))

    def on_checked(self) -> None:
        return None

    def on_burst_drained(self) -> None:
        self.drained.set()

    def on_consumer_failed(self, exc: BaseException) -> None:
        return None


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def consumer_thread(
    loop: asyncio.AbstractEventLoop, *, mover: Mover | None = None, **worker: Any
) -> tuple[ConsumerThread, FakeConsumer, FakeSide]:
    settings = Settings(namespace="ns", worker=worker)
    side = FakeSide(loop)
    made: list[FakeConsumer] = []

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        made.append(FakeConsumer(conf))
        return made[0]

    thread = ConsumerThread(
        settings=settings,
        group_id="ns.workers",
        topics={TOPIC: (Priority.DEFAULT, 0)},
        side=side,
        metrics=WorkerMetrics(),
        mover=mover,
        consumer_factory=factory,  # type: ignore[arg-type]
    )
    return thread, made[0], side


def own(thread: ConsumerThread, *partitions: int) -> list[PartitionState]:
    states = [PartitionState(TOPIC, p, Priority.DEFAULT, 0) for p in partitions]
    for state in states:
        state.read_back = True  # as if assigned and read back
        thread.states[(TOPIC, state.partition)] = state
    return states


def messages(partition: int, start: int, count: int) -> list[Message]:
    return [
        Message(topic=TOPIC, partition=partition, offset=o, value=b"x")
        for o in range(start, start + count)
    ]


def flush(loop: asyncio.AbstractEventLoop) -> None:
    """Wait until the loop ran every callback handed to it so far."""
    done = threading.Event()
    loop.call_soon_threadsafe(done.set)
    assert done.wait(5)


def test_the_consumer_settings_follow_the_design() -> None:
    conf = consumer_config(Settings(namespace="ns", kafka={"fetch.min.bytes": "7"}), "g")
    assert conf["group.protocol"] == "consumer"
    assert conf["group.remote.assignor"] == "range"  # co-partitions the priority topics
    assert conf["enable.auto.commit"] is False
    assert conf["enable.auto.offset.store"] is False
    assert conf["isolation.level"] == "read_committed"
    assert conf["auto.offset.reset"] == "earliest"
    assert conf["fetch.min.bytes"] == "7"
    assert conf["socket.nagle.disable"] is True  # fetches and commits go out at once
    # Pausing a full partition throws its prefetch away: the prefetch stays far below the
    # buffer it feeds, and a fetch far below librdkafka's 1 MiB a partition.
    assert conf["queued.min.messages"] * 10 <= Settings().worker.buffer_size
    assert conf["max.partition.fetch.bytes"] <= 64 * 1024
    assert conf["fetch.queue.backoff.ms"] <= 10  # else a small prefetch waits 1 s per refill
    override = Settings(worker={"kafka_consumer": {"isolation.level": "read_uncommitted"}})
    assert consumer_config(override, "g")["isolation.level"] == "read_uncommitted"


def test_a_full_buffer_pauses_its_partition_and_a_drained_one_resumes(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = consumer_thread(loop, buffer_size=10)
    full, other = own(thread, 0, 1)
    thread._hand(messages(0, 0, 6) + messages(1, 0, 3))
    assert fake.paused == set()
    thread._hand(messages(0, 6, 6))  # 12 buffered >= 10
    assert fake.paused == {(TOPIC, 0)}
    assert full.paused
    assert (full.handed, full.handed_next) == (12, 12)
    flush(loop)
    assert sum(len(group) for batch in side.batches for _, group in batch) == 15  # none lost
    full.taken = 6  # 6 left: still above the resume mark (5)
    thread._flow.resume_drained()
    assert fake.paused == {(TOPIC, 0)}
    full.taken = 7
    thread._flow.resume_drained()
    assert fake.paused == set()
    assert not full.paused
    assert not other.paused


def test_resuming_when_everything_was_paused_wakes_the_fetcher(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, _ = consumer_thread(loop, buffer_size=4)
    first, second = own(thread, 0, 1)
    thread._hand(messages(0, 0, 4) + messages(1, 0, 4))
    assert fake.paused == {(TOPIC, 0), (TOPIC, 1)}
    first.taken = 4
    thread._flow.resume_drained()
    # Every partition was paused: librdkafka's fetcher sleeps until some request wakes it.
    assert fake.watermark_queries == [(TOPIC, 0)]
    thread._hand(messages(0, 4, 4))
    second.taken = 4
    thread._flow.resume_drained()
    assert fake.watermark_queries == [(TOPIC, 0), (TOPIC, 1)]
    first.taken = 8
    thread._hand(messages(1, 4, 1))
    thread._flow.resume_drained()  # partition 1 was fetching all along: no wake-up needed
    assert fake.watermark_queries == [(TOPIC, 0), (TOPIC, 1)]


def test_a_batch_is_grouped_by_partition_in_order(loop: asyncio.AbstractEventLoop) -> None:
    thread, _, side = consumer_thread(loop)
    own(thread, 0, 1)
    thread._hand(messages(0, 0, 2) + messages(1, 5, 1) + messages(0, 2, 1))
    flush(loop)
    [batch] = side.batches
    assert [(s.partition, [m.offset() for m in g]) for s, g in batch] == [
        (0, [0, 1]),
        (1, [5]),
        (0, [2]),
    ]


def test_end_of_partition_events_mark_the_partition_drained_until_more_arrives(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, _, _ = consumer_thread(loop, burst=True)
    [state] = own(thread, 0)
    eof = Message(topic=TOPIC, partition=0, offset=3, error=KafkaError(KafkaError._PARTITION_EOF))
    thread._hand([*messages(0, 0, 3), eof])
    assert state.at_end
    thread._hand([eof, *messages(0, 3, 1)])
    assert not state.at_end


def test_a_consumer_error_of_no_partition_names_none(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    """A group's error (a JoinGroup refused) comes on no topic: it read "consumer error on
    None[-1]"."""
    joined = Message(error=KafkaError(KafkaError.INVALID_GROUP_ID, "JoinGroup failed"))
    on_topic = Message(topic=TOPIC, partition=2, error=KafkaError(KafkaError._TRANSPORT, "down"))
    for message in (joined, on_topic):  # a thread each: the warnings are rate-limited
        thread, _, _ = consumer_thread(loop)
        thread._hand([message])
    assert "consumer error: JoinGroup failed" in caplog.text
    assert f"consumer error on {TOPIC}[2]: down" in caplog.text
    assert "None" not in caplog.text


def test_a_session_timeout_the_broker_refuses_stops_the_worker_naming_the_setting(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused at every join: a --burst worker tried again for good and never exited."""
    thread, _, _ = consumer_thread(loop)
    refused = KafkaError(KafkaError.INVALID_SESSION_TIMEOUT, "JoinGroup failed: Invalid session")
    thread._hand([Message(error=refused)])
    assert thread.stop_requested
    assert "fatal consumer error: JoinGroup failed: Invalid session" in caplog.text
    assert "worker.session_timeout_ms is outside what the broker allows" in caplog.text


@pytest.mark.parametrize(
    ("error", "topic", "says"),
    [
        (KafkaError.GROUP_AUTHORIZATION_FAILED, None, "lacks READ on GROUP ns.workers"),
        (KafkaError.TOPIC_AUTHORIZATION_FAILED, TOPIC, f"lacks READ on TOPIC {TOPIC}"),
    ],
)
def test_a_read_the_acls_refuse_stops_the_worker_naming_what_it_lacks(
    loop: asyncio.AbstractEventLoop, error: int, topic: str | None, says: str
) -> None:
    """A worker without READ on its group logged one warning and sat with no partition for
    good, /healthz ok, a --burst run never ending."""
    thread, _, _ = consumer_thread(loop)
    refused = Message(topic=topic, partition=0, error=KafkaError(error, "authorization failed"))
    with pytest.raises(NotAuthorizedError) as raised:
        thread._hand([refused])
    assert says in str(raised.value)
    assert "`pipeline acls apply --role worker" in str(raised.value)
    assert raised.value.exit_code == 4


def finish_all(state: PartitionState) -> None:
    state.taken = state.handed
    state.commit_offset = state.handed_next


def test_commits_take_the_watermark_and_the_position_past_transaction_markers(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, _ = consumer_thread(loop)
    busy, idle, untouched = own(thread, 0, 1, 2)
    thread._hand(messages(0, 0, 10) + messages(1, 0, 5))
    busy.commit_offset = 4  # offsets 4.. still running
    finish_all(idle)
    fake.positions = {(TOPIC, 0): 10, (TOPIC, 1): 6}  # a commit marker at offset 5
    thread._committer.commit(thread.states.values(), 0.0)
    assert fake.commits == [(True, [(TOPIC, 0, 4), (TOPIC, 1, 6)])]
    assert untouched.committed == -1
    thread._committer.on_commit(None, [TopicPartition(TOPIC, 0, 4), TopicPartition(TOPIC, 1, 6)])
    assert (busy.committed, idle.committed) == (4, 6)
    thread._committer.commit(thread.states.values(), 1.0)
    assert len(fake.commits) == 1  # nothing moved: nothing to commit


def test_a_position_past_the_partition_s_end_is_committed_as_its_end(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """librdkafka from 2.2 until late 2025 moved the position two past the last message when a
    batch carried the end-of-partition event: committed, it skipped the next message written
    (or sent the next owner back to the start)."""
    thread, fake, _ = consumer_thread(loop)
    (state,) = own(thread, 0)
    thread._hand(messages(0, 0, 6))  # offsets 0-5: the partition's end is 6
    finish_all(state)
    fake.ends = {(TOPIC, 0): (0, 6)}
    fake.positions = {(TOPIC, 0): 7}
    thread._committer.commit(thread.states.values(), 0.0)
    assert fake.commits == [(True, [(TOPIC, 0, 6)])]


def test_a_scheduled_commit_waits_while_the_previous_one_is_unanswered(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, _ = consumer_thread(loop)
    (state,) = own(thread, 0)
    thread._hand(messages(0, 0, 10))
    committer = thread._committer
    state.commit_offset = 3
    committer.commit(thread.states.values(), 0.0)
    state.commit_offset = 6
    committer.commit(thread.states.values(), 1.0)  # the first one is not answered yet
    assert fake.commits == [(True, [(TOPIC, 0, 3)])]
    committer.on_commit(None, [TopicPartition(TOPIC, 0, 3)])
    committer.commit(thread.states.values(), 2.0)  # answered: the offsets waited are sent
    assert fake.commits[-1] == (True, [(TOPIC, 0, 6)])
    state.commit_offset = 8
    committer.commit(thread.states.values(), 3.0, clean=True)  # a partition handed over
    assert fake.commits[-1] == (True, [(TOPIC, 0, 8)])
    state.commit_offset = 9
    committer._started[-1] -= committer_module.IN_FLIGHT_WAIT_S  # unanswered for too long
    committer.commit(thread.states.values(), 4.0)
    assert fake.commits[-1] == (True, [(TOPIC, 0, 9)])


def commit_in_flight(
    loop: asyncio.AbstractEventLoop,
) -> tuple[ConsumerThread, FakeConsumer, FakeProducer, Mover]:
    """A consumer thread with a mover, partition 0 owned, four jobs handed, two finished and
    committed asynchronously: the commit is on its way, not answered yet."""
    producer = FakeProducer()
    mover = Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    thread, fake, _ = consumer_thread(loop, mover=mover)
    [state] = own(thread, 0)
    thread._hand(messages(0, 0, 4))
    state.commit_offset = 2
    thread._committer.commit(thread.states.values(), time.monotonic())
    assert [asynchronous for asynchronous, _ in fake.commits] == [True]
    return thread, fake, producer, mover


def test_a_transaction_opens_only_once_the_asynchronous_commit_before_it_is_answered(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """An asynchronous commit still on its way could reach the group coordinator after the
    offsets of a transaction begun meanwhile, and put back a mark without its moves."""
    thread, fake, producer, mover = commit_in_flight(loop)
    committer = thread._committer
    written: list[bool] = []
    mover.submit((TOPIC, 0), 3, [Record("ns.dlq", b"3", None)], written.append)
    thread._chores(time.monotonic(), idle=True)
    assert "begin_transaction" not in producer.calls
    assert not mover.open
    committer.on_commit(None, fake.sent[0])  # Kafka answers the commit
    thread._chores(time.monotonic(), idle=True)
    assert mover.open
    assert producer.calls.count("begin_transaction") == 1
    flush(loop)
    assert written == [True]


def test_a_revocation_opens_no_transaction_while_an_asynchronous_commit_is_unanswered(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The steady state and the final commit wait for that commit's answer; the revocation's
    wait for its jobs wrote their moves in a transaction all the same, whose offsets the
    older commit could then overwrite at the coordinator: the moved jobs ran again."""
    thread, fake, producer, mover = commit_in_flight(loop)
    thread.rebalance._incremental = True
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    committer = thread._committer
    written: list[bool] = []
    mover.submit((TOPIC, 0), 3, [Record("ns.dlq", b"3", None)], written.append)
    # The revocation's jobs end once the wait loop has looked at the moves once.
    looked = asyncio.run_coroutine_threadsafe(_event(), loop).result(5)
    real_awaiting, real_drain = committer.awaiting, thread.rebalance._drain_moves

    def awaiting(now: float) -> bool:
        loop.call_soon_threadsafe(looked.set)
        return real_awaiting(now)

    def drain() -> None:
        real_drain()
        loop.call_soon_threadsafe(looked.set)

    async def revoke(states: object, *, lost: bool) -> None:
        await looked.wait()

    committer.awaiting = awaiting  # type: ignore[method-assign]
    thread.rebalance._drain_moves = drain
    thread._side.revoke = revoke  # type: ignore[method-assign]
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    assert "begin_transaction" not in producer.calls
    flush(loop)
    assert written == [False]  # not written: the partition's next owner runs the job again


async def _event() -> asyncio.Event:
    return asyncio.Event()


def test_offsets_finished_while_a_commit_waited_go_with_the_next_one(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, _ = consumer_thread(loop)
    (state,) = own(thread, 0)
    committer = thread._committer
    for offset in range(20):
        state.tracker.add(offset)

    def finish(offsets: range) -> None:
        for offset in offsets:
            watermark = state.tracker.finish(offset)
            assert watermark is not None  # offsets were added
            state.commit_offset = watermark

    finish(range(1, 6))  # offset 0 runs on: the commit point stays at 0
    committer.commit(thread.states.values(), 0.0)
    finish(range(6, 15))
    committer.commit(thread.states.values(), 1.0)  # waits: the first one is unanswered
    assert len(fake.sent) == 1
    committer.on_commit(None, fake.sent[0])
    committer.commit(thread.states.values(), 2.0)
    [tp] = fake.sent[-1]
    assert CommitMark.decode(tp.offset, tp.metadata).finished == ((1, 15),)


def test_commits_are_due_by_time_or_by_count(loop: asyncio.AbstractEventLoop) -> None:
    thread, _, _ = consumer_thread(loop, commit_interval_s=2.0, commit_every=100)
    committer = thread._committer
    committer.commit([], 10.0, finished=0)
    assert not committer.due(11.0, finished=99)
    assert committer.due(11.0, finished=100)
    assert committer.due(12.0, finished=0)


INCREMENTAL: dict[str, Any] = {
    "kafka_consumer": {"partition.assignment.strategy": "cooperative-sticky"}
}


def test_a_revoked_partition_is_committed_synchronously_once_its_jobs_are_done(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = consumer_thread(loop, **INCREMENTAL)
    kept, revoked = own(thread, 0, 1)
    thread._hand(messages(1, 0, 8))
    revoked.commit_offset = 5
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
    assert [([s.partition for s in states], lost) for states, lost in side.revoked] == [
        ([1], False)
    ]
    # Asynchronous: a blocking call inside a rebalance callback breaks the binding.
    assert fake.commits == [(True, [(TOPIC, 1, 5)])]
    assert fake.unassigned == [(TOPIC, 1)]
    assert list(thread.states.values()) == [kept]
    thread._committer.commit(thread.states.values(), 0.0)
    assert len(fake.commits) == 1  # never again for a partition no longer owned


def test_a_lost_partition_is_not_committed(loop: asyncio.AbstractEventLoop) -> None:
    thread, fake, side = consumer_thread(loop, **INCREMENTAL)
    [lost] = own(thread, 3)
    lost.commit_offset = 9
    thread.rebalance.on_lost(fake, [TopicPartition(TOPIC, 3)])  # type: ignore[arg-type]
    assert side.revoked[0][1] is True
    assert fake.commits == []
    assert fake.unassigned == [(TOPIC, 3)]


def test_an_eager_rebalance_hands_over_the_whole_assignment(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, _ = consumer_thread(loop, kafka_consumer={"group.protocol": "classic"})
    both = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    thread.rebalance.on_assign(fake, both)  # type: ignore[arg-type]
    assert fake.assignments == [[(TOPIC, 0), (TOPIC, 1)]]
    thread.rebalance.on_revoke(fake, both)  # type: ignore[arg-type]
    assert fake.unassigned == [("everything", -1)]
    assert thread.states == {}


def burst_check(thread: ConsumerThread) -> Callable[[], None]:
    """Run the burst check as the consumer loop does when a poll returned nothing."""
    thread.rebalance.assigned_once = True
    thread._cluster.share_changed = True

    def check() -> None:
        thread._burst_watch.recheck_now()
        thread._update_share()
        if thread._burst_watch.drained(1.0):
            thread._side.on_burst_drained()

    return check


def test_a_burst_ends_once_every_partition_is_at_its_end_and_finished(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = consumer_thread(loop, burst=True)
    states = own(thread, 0, 1)
    check = burst_check(thread)
    fake.ends = {(TOPIC, 0): (0, 4)}
    thread._hand(messages(0, 0, 4))
    states[0].commit_offset = 2  # two jobs still running
    for state in states:
        state.at_end = True
    states[0].taken = 4
    check()
    assert not side.drained.is_set()
    finish_all(states[0])
    fake.positions = {(TOPIC, 0): 4}
    check()
    assert side.drained.wait(5)
    assert fake.commits == [(False, [(TOPIC, 0, 4)])]


def test_a_burst_waits_for_partitions_not_yet_at_their_end(loop: asyncio.AbstractEventLoop) -> None:
    thread, _, side = consumer_thread(loop, burst=True)
    states = own(thread, 0, 1)
    check = burst_check(thread)
    states[0].at_end = True
    check()
    flush(loop)
    assert not side.drained.is_set()
    states[1].at_end = True
    check()
    assert side.drained.wait(5)


def test_a_burst_waits_for_the_partitions_other_members_still_drain(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = consumer_thread(loop, burst=True)
    [mine] = own(thread, 0)
    mine.at_end = True
    check = burst_check(thread)
    fake.ends = {(TOPIC, 1): (0, 10)}  # partition 1 belongs to another worker: 10 jobs
    fake.group_committed = {(TOPIC, 1): 6}
    check()
    flush(loop)
    assert not side.drained.is_set()
    fake.group_committed = {(TOPIC, 1): 10}
    check()
    assert side.drained.wait(5)


class ScriptedPolls:
    """``poll`` answers from a script on a fake clock, then asks the thread to stop."""

    def __init__(self, thread: ConsumerThread, script: list[Message | None], step_s: float):
        self.thread = thread
        self.script = script
        self.step_s = step_s
        self.now = 100.0
        self.log: list[str] = []

    def monotonic(self) -> float:
        return self.now

    def poll(self, timeout: float) -> Message | None:
        self.log.append("poll")
        self.now += self.step_s
        if not self.script:
            self.thread.stop_requested = True
            return None
        return self.script.pop(0)


def scripted(
    loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
    script: list[Message | None],
    step_s: float,
) -> ScriptedPolls:
    thread, fake, _side = consumer_thread(loop, consume_batch=1)
    own(thread, 0)
    polls = ScriptedPolls(thread, script, step_s)
    fake.poll = polls.poll  # type: ignore[attr-defined]
    fake.consume = lambda count, timeout: []  # type: ignore[attr-defined]
    monkeypatch.setattr(consumer_module, "time", SimpleNamespace(monotonic=polls.monotonic))
    hand, chores = thread._hand, thread._chores

    def logged_hand(batch: list[Message]) -> None:
        polls.log.append("hand")
        hand(batch)

    def logged_chores(now: float, *, idle: bool) -> None:
        polls.log.append("chores")
        chores(now, idle=idle)

    monkeypatch.setattr(thread, "_hand", logged_hand)
    monkeypatch.setattr(thread, "_chores", logged_chores)
    thread._loop()
    return polls


def test_after_handing_a_batch_the_thread_polls_again_before_its_chores(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Chores between a hand and the next poll hold the GIL the event loop needs to start the
    # job: they wait until a poll comes back empty.
    polls = scripted(loop, monkeypatch, [*messages(0, 0, 2), None], step_s=0.0001)
    assert polls.log[:6] == ["poll", "hand", "poll", "hand", "poll", "chores"]


def test_the_chores_wait_at_most_chores_s_while_batches_keep_coming(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    polls = scripted(loop, monkeypatch, list(messages(0, 0, 40)), step_s=0.001)  # 40 ms
    hands_between = []
    hands = 0
    for entry in polls.log:
        if entry == "hand":
            hands += 1
        elif entry == "chores":
            hands_between.append(hands)
            hands = 0
    assert hands_between[:-1], "the chores ran only when the batches stopped"
    per_chores = round(CHORES_S / 0.001)
    assert all(count <= per_chores for count in hands_between)


def handed_offsets(side: FakeSide) -> list[tuple[int, list[int]]]:
    return [(s.partition, [m.offset() for m in g]) for batch in side.batches for s, g in batch]


def test_messages_delivered_before_a_partition_is_read_back_wait_until_it_is(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """librdkafka can deliver a few messages it fetched between an assignment and the pause
    that follows it: they reach the loop only once the partition's commit mark is read (its
    keys restored, its mark secured), and before anything fetched after its resume."""
    thread, fake, side = consumer_thread(loop, kafka_consumer={"group.protocol": "classic"})
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    [state] = thread.states.values()
    assert fake.paused == {(TOPIC, 0)}
    thread._hand(messages(0, 0, 3))
    flush(loop)
    assert side.batches == []
    assert (state.handed, state.handed_next) == (0, -1)  # nothing to commit past them
    thread._chores(0.0, idle=True)  # reads the mark back and resumes the partition
    thread._hand(messages(0, 3, 1))
    flush(loop)
    assert fake.paused == set()
    assert handed_offsets(side) == [(0, [0, 1, 2]), (0, [3])]
    assert (state.handed, state.handed_next) == (4, 4)


def test_the_end_of_a_partition_seen_while_it_was_read_back_stands_when_its_held_messages_go(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """The messages held until a partition is read back came before its end-of-partition event:
    handing them later must not make the partition look undrained (a burst run would wait for
    an event that librdkafka does not send twice)."""
    thread, fake, side = consumer_thread(
        loop, burst=True, kafka_consumer={"group.protocol": "classic"}
    )
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    [state] = thread.states.values()
    eof = Message(topic=TOPIC, partition=0, offset=3, error=KafkaError(KafkaError._PARTITION_EOF))
    thread._hand([*messages(0, 0, 3), eof])
    assert state.at_end
    thread._chores(0.0, idle=True)  # reads the mark back and hands the held messages
    flush(loop)
    assert handed_offsets(side) == [(0, [0, 1, 2])]
    assert state.at_end


def test_messages_held_for_a_partition_revoked_before_it_was_read_back_are_dropped(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = consumer_thread(loop, kafka_consumer={"group.protocol": "classic"})
    both = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    thread.rebalance.on_assign(fake, both)  # type: ignore[arg-type]
    thread._hand(messages(0, 0, 2) + messages(1, 0, 2))
    thread.rebalance.on_revoke(fake, both)  # type: ignore[arg-type]
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
    thread._chores(0.0, idle=True)
    flush(loop)
    assert side.batches == [], "what the next owner of partition 0 runs, and 1 is fetched anew"


def test_the_member_id_is_read_on_the_consumer_thread_once_assigned(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeats carry it (``pipeline status`` tells replicas sharing a client id apart by
    it); ``memberid()`` waits for this thread's poll, so the loop must not ask it itself."""
    thread, fake, _ = consumer_thread(loop)
    answers = iter(["m-1", None, "m-2"])
    asked: list[int] = []

    def memberid() -> str | None:
        asked.append(threading.get_ident())
        return next(answers)

    monkeypatch.setattr(fake, "memberid", memberid)
    thread._chores(0.0, idle=True)
    assert (thread.member_id, asked) == ("", [])  # not assigned yet: nothing asked
    thread.rebalance.assigned_once = True
    thread._chores(0.0, idle=True)
    thread._chores(0.5, idle=True)  # within MEMBER_ID_S: not asked again
    assert thread.member_id == "m-1"
    thread._chores(1.0, idle=True)  # no answer (leaving the group): the last one stays
    assert thread.member_id == "m-1"
    thread._chores(2.0, idle=True)
    assert thread.member_id == "m-2"
    assert asked == [threading.get_ident()] * 3


def test_burst_members_at_the_end_of_partitions_that_deliver_nothing_commit_that_end(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """What lies between a committed offset and the end may never be delivered (transaction
    markers, aborted records, records retention deleted): each member was done with its own
    partition, committed nothing for it (it handed nothing), and waited for the other's."""
    a, fake_a, side_a = consumer_thread(loop, burst=True)
    b, fake_b, side_b = consumer_thread(loop, burst=True)
    group = {(TOPIC, 0): 5, (TOPIC, 1): 5}  # the group's committed offsets, shared
    for fake in (fake_a, fake_b):
        fake.group_committed = group
        fake.ends = {(TOPIC, 0): (10, 10), (TOPIC, 1): (10, 10)}
        fake.positions = {(TOPIC, 0): 10, (TOPIC, 1): 10}
    [mine_a] = own(a, 0)
    [mine_b] = own(b, 1)
    for state in (mine_a, mine_b):
        state.committed = 5
        state.at_end = True  # fetched from the reset offset, 10: end of partition, none handed
    check_a, check_b = burst_check(a), burst_check(b)
    for _ in range(3):
        check_a()
        check_b()
    flush(loop)
    assert group == {(TOPIC, 0): 10, (TOPIC, 1): 10}
    assert side_a.drained.is_set()
    assert side_b.drained.is_set()


def test_a_burst_that_waits_long_says_what_for(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    """A burst run that never ended logged nothing past its assignment: nothing told why."""
    thread, _, _ = consumer_thread(loop, burst=True)
    [state] = own(thread, 0)
    thread._hand(messages(0, 0, 3))  # handed, not finished: the run goes on
    watch = thread._burst_watch
    with caplog.at_level(logging.INFO, logger="pipeline.worker.consumer"):
        assert not watch.drained(1000.0)
        assert "burst: waiting" not in caplog.text
        assert not watch.drained(1000.0 + SAY_AFTER_S)
    assert f"burst: waiting for {TOPIC}[0]: at end False" in caplog.text
    assert f"handed 3, taken {state.taken}" in caplog.text
    assert f"for {SAY_AFTER_S:.0f}s" in caplog.text
