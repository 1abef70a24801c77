"""Poison-pill detection: commit marks, takeover plans, quarantines and leases (no Kafka).

The last tests drive the consumer thread's glue against a fake consumer, and replay whole
crash sequences (owner after owner) through the pure logic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Message, TopicPartition

from pipeline import Priority, Settings
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._work import PartitionState
from pipeline_worker.commit.marks import CommitMark
from pipeline_worker.intake.consumer import ConsumerThread
from pipeline_worker.recovery.guard import Guard
from pipeline_worker.recovery.poison import PoisonPillError
from pipeline_worker.recovery.quarantine import (
    Quarantine,
    Step,
    Takeover,
    needs_watermarks,
    plan_takeover,
)

TOPIC = "ns.jobs.default"
LEASE = 10


def messages(start: int, count: int, partition: int = 0) -> list[Message]:
    return [
        Message(topic=TOPIC, partition=partition, offset=o, value=b"x")
        for o in range(start, start + count)
    ]


def offsets(group: list[Message]) -> list[int]:
    return [m.offset() for m in group]  # type: ignore[misc]


# -- commit marks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mark",
    [
        CommitMark(7),
        CommitMark(7, dirty=True),
        CommitMark(7, (9, 12), dirty=True, high=2007, strikes=2),
        CommitMark(0, dirty=True, high=41, strikes=1),
        CommitMark(15, dirty=True, high=41, window=23),
        CommitMark(20, dirty=False, high=5),  # a promise below the offset (position commits)
    ],
)
def test_a_commit_mark_survives_its_round_trip(mark: CommitMark) -> None:
    encoded = mark.encode()
    assert len(encoded) < 100
    assert CommitMark.decode(mark.offset, encoded) == mark


def test_metadata_not_ours_reads_as_a_clean_mark_without_promises() -> None:
    for metadata in (None, "", "garbage", '{"v": 2, "d": 1}', '["v"]', '{"v":1,"s":"x"}'):
        assert CommitMark.decode(3, metadata) == CommitMark(3)


# -- takeover --------------------------------------------------------------------------------


def test_a_partition_never_committed_starts_at_its_first_offset_without_suspicion() -> None:
    assert needs_watermarks(None, 3)
    assert plan_takeover(None, (5, 90), 3) == Takeover(5, 5, 0)


def test_a_clean_hand_over_means_no_quarantine() -> None:
    clean = CommitMark(10, high=50)
    assert not needs_watermarks(clean, 3)
    assert not plan_takeover(clean, None, 3).quarantined


def test_a_dirty_mark_quarantines_up_to_its_promise_or_the_end_whichever_is_first() -> None:
    dirty = CommitMark(10, dirty=True, high=50, strikes=1)
    assert needs_watermarks(dirty, 3)
    assert plan_takeover(dirty, (0, 90), 3) == Takeover(10, 50, 1, alone=10)
    # Offsets at or past the end did not exist when the previous owner died.
    assert plan_takeover(dirty, (0, 30), 3) == Takeover(10, 30, 1, alone=10)
    nothing_there = plan_takeover(dirty, (0, 10), 3)
    assert not nothing_there.quarantined


def test_a_group_that_ran_together_when_its_owner_died_is_to_run_one_at_a_time() -> None:
    dirty = CommitMark(15, dirty=True, high=41, window=23)
    assert plan_takeover(dirty, (0, 90), 3) == Takeover(15, 41, 0, alone=23)


def test_a_dirty_mark_without_a_promise_suspects_its_first_job_only() -> None:
    assert plan_takeover(CommitMark(10, dirty=True), (0, 90), 3) == Takeover(10, 11, 0, alone=10)


def test_detection_off_never_quarantines() -> None:
    dirty = CommitMark(10, dirty=True, high=50, strikes=5)
    assert not needs_watermarks(dirty, 0)
    assert not plan_takeover(dirty, (0, 90), 0).quarantined


# -- quarantine ------------------------------------------------------------------------------


def test_a_quarantine_grows_its_windows_while_they_finish_and_counts_strikes_alone() -> None:
    quarantine = Quarantine(until=20, offset=10, strikes=1, limit=3, alone=10, cap=4)
    assert quarantine.step(10, -1) is Step.RUN
    assert quarantine.window_size(10) == 1
    assert quarantine.strikes_for(10) == 2  # the previous owner's strike, and this run
    quarantine.handed(10, 10)
    assert quarantine.suspects == 11
    assert quarantine.step(11, 10) is Step.WAIT  # 10 still runs
    assert quarantine.step(11, 11) is Step.RUN
    assert quarantine.window_size(11) == 2
    assert quarantine.strikes_for(11) == 1  # were it alone
    quarantine.handed(11, 12)
    assert quarantine.suspects == 13
    assert quarantine.step(13, 12) is Step.WAIT  # 12 still runs
    assert quarantine.step(13, 13) is Step.RUN
    assert quarantine.window_size(13) == 4
    quarantine.handed(13, 16)
    assert quarantine.step(17, 17) is Step.RUN
    assert quarantine.window_size(17) == 4  # the cap
    quarantine.handed(17, 19)
    assert quarantine.step(None, 19) is Step.WAIT
    assert quarantine.step(None, 20) is Step.END
    assert quarantine.step(21, 20) is Step.END


def test_a_group_that_killed_its_owner_runs_one_at_a_time_then_windows_grow_again() -> None:
    quarantine = Quarantine(until=41, offset=15, strikes=0, limit=2, alone=23, cap=8)
    for offset in range(15, 23):
        assert quarantine.step(offset, offset) is Step.RUN
        assert quarantine.window_size(offset) == 1
        quarantine.handed(offset, offset)
        assert quarantine.suspects == 23  # the rest of the group stays suspect
    assert quarantine.step(23, 23) is Step.RUN
    assert quarantine.window_size(23) == 1
    quarantine.handed(23, 23)
    assert quarantine.suspects == 24
    assert quarantine.step(24, 24) is Step.RUN
    assert quarantine.window_size(24) == 2


def test_a_job_past_the_limit_is_dead_lettered_instead_of_run() -> None:
    quarantine = Quarantine(until=30, offset=20, strikes=2, limit=2, alone=21, cap=8)
    assert quarantine.is_poison(20)
    assert quarantine.step(20, -1) is Step.DEAD
    quarantine.handed(20, 20)
    assert quarantine.step(21, 20) is Step.WAIT  # until its move is made
    assert quarantine.step(21, 21) is Step.RUN
    assert not quarantine.is_poison(21)


def test_offsets_that_never_come_end_a_quarantine_by_the_consumer_position() -> None:
    # 11 and 12 are transaction markers: never delivered, so never handed.
    quarantine = Quarantine(until=13, offset=10, strikes=0, limit=3, alone=10)
    quarantine.handed(10, 10)
    assert quarantine.step(None, 11, position=11) is Step.WAIT
    assert quarantine.step(None, 11, position=13) is Step.END


# -- guards: leases ---------------------------------------------------------------------------


def guard(
    start: int = 0, *, until: int | None = None, strikes: int = 0, lease: int = LEASE
) -> Guard:
    plan = Takeover(start, until if until is not None else start, strikes, start)
    return Guard(plan, lease=lease, limit=3, window=4)


def test_nothing_is_handed_before_the_new_owners_mark_is_acknowledged() -> None:
    g = guard(100)
    assert g.take(messages(100, 3)) == []
    assert offsets(list(g.withheld)) == [100, 101, 102]
    mark = g.stamp(100, (), clean=False)
    assert (mark.dirty, mark.high, mark.strikes) == (True, 100 + LEASE, 0)
    g.acknowledged(mark.high)
    assert offsets(g.release()) == [100, 101, 102]
    assert g.released == 103


def test_only_offsets_below_the_acknowledged_lease_go_to_the_loop() -> None:
    g = guard(0)
    g.acknowledged(g.stamp(0, (), clean=False).high)  # lease: offsets below 10
    assert offsets(g.take(messages(0, 4))) == [0, 1, 2, 3]
    assert not g.short
    assert offsets(g.take(messages(4, 8))) == [4, 5, 6, 7, 8, 9]
    assert offsets(list(g.withheld)) == [10, 11]
    assert g.take(messages(12, 1)) == []  # behind the held ones, in order
    assert g.short
    assert g.extend()  # a commit must carry the new promise
    assert g.promised == 13 + LEASE
    assert g.release() == []  # not acknowledged yet
    mark = g.stamp(10, (), clean=False)
    assert not g.extend()  # sent already: no second commit for it
    g.acknowledged(mark.high)
    assert offsets(g.release()) == [10, 11, 12]
    assert not g.short


def test_a_lease_grows_before_it_runs_out() -> None:
    g = guard(0)
    g.acknowledged(g.stamp(0, (), clean=False).high)
    g.take(messages(0, 4))
    assert not g.short
    g.take(messages(4, 2))  # 6 handed: only 4 of the 10 promised left
    assert g.short
    g.extend()
    assert g.promised == 6 + LEASE
    g.acknowledged(g.stamp(0, (), clean=False).high)
    assert offsets(g.take(messages(6, 9))) == list(range(6, 15))  # no wait


def test_promises_only_grow_and_acknowledgements_only_raise_the_lease() -> None:
    g = guard(0)
    g.acknowledged(25)
    g.acknowledged(12)  # an older commit's answer, arriving late
    assert g.secured == 25
    g.promised = 30
    g.end_quarantine()
    assert g.promised == 30


def test_with_detection_off_everything_goes_through_and_nothing_is_promised() -> None:
    g = guard(0, lease=0)
    assert offsets(g.take(messages(0, 5))) == [0, 1, 2, 3, 4]
    assert not g.short
    assert not g.extend()
    assert not g.unsecured
    mark = g.stamp(5, (), clean=False)
    assert (mark.dirty, mark.high) == (True, -1)


# -- guards: quarantine marks -----------------------------------------------------------------


def test_a_quarantined_gate_holds_everything_and_stamps_its_window() -> None:
    g = guard(20, until=41, strikes=1)
    quarantine = g.quarantine
    assert quarantine is not None
    assert g.take(messages(20, 3)) == []
    takeover = g.stamp(20, (), clean=False)
    assert (takeover.dirty, takeover.high, takeover.strikes) == (True, 41, 1)
    g.window(20, quarantine.strikes_for(20))
    quarantine.handed(20, 20)
    alone = g.stamp(20, (), clean=False)
    assert (alone.strikes, alone.window) == (2, 21)
    assert g.stamp(21, (), clean=False).strikes == 0  # once 20 is done
    assert g.release() == []  # handing is the quarantine's business
    g.window(21, 0)
    quarantine.handed(21, 22)
    group = g.stamp(21, (), clean=False)
    assert (group.offset, group.strikes, group.window) == (21, 0, 23)


def test_a_clean_hand_over_during_a_quarantine_stays_dirty_and_takes_back_the_running_strike() -> (
    None
):
    g = guard(20, until=41, strikes=1)
    assert g.quarantine is not None
    g.window(20, 2)
    g.quarantine.handed(20, 20)
    handed_over = g.stamp(20, (), clean=True)
    # 20 did not kill anyone while we ran it: the next owner carries on where we were.
    assert (handed_over.dirty, handed_over.high, handed_over.strikes) == (True, 41, 1)
    assert handed_over.window == -1


def test_strikes_found_at_takeover_stay_until_the_job_is_done() -> None:
    g = guard(20, until=41, strikes=2)  # about to be dead-lettered
    assert g.stamp(20, (), clean=True).strikes == 2
    assert g.stamp(20, (), clean=False).strikes == 2


def test_after_a_quarantine_strikes_are_0_and_marks_are_clean_again() -> None:
    g = guard(20, until=23, strikes=1)
    g.acknowledged(g.stamp(20, (), clean=False).high)
    g.take(messages(23, 2))  # 20..22 ran in the quarantine already
    g.window(22, 1)
    g.end_quarantine()
    assert g.quarantine is None
    assert g.promised == 25 + LEASE  # the held messages and a lease beyond them
    mark = g.stamp(22, (), clean=True)
    assert (mark.dirty, mark.strikes, mark.window) == (False, 0, -1)
    assert g.release() == []  # after the new promise is acknowledged
    g.acknowledged(g.stamp(23, (), clean=False).high)
    assert offsets(g.release()) == [23, 24]


# -- whole crash sequences, owner after owner ------------------------------------------------


def replay(
    count: int, poison: set[int], limit: int, *, window: int = 8, lease: int = 2000
) -> tuple[list[int], list[int], int]:
    """Owners take over one partition of ``count`` messages in turn, as the consumer thread
    would, until one drains it. An owner hands every allowed message at once outside a
    quarantine, windows of them inside; the jobs handed together run concurrently, and a poison
    pill among them kills the owner before anything more is committed. Returns the offsets of
    every run, the dead-lettered ones and how many owners it took."""
    committed: CommitMark | None = None
    runs: list[int] = []
    dead: list[int] = []
    for owner in range(1, 30):
        plan = plan_takeover(committed, (0, count), limit)
        g = Guard(plan, lease=lease, limit=limit, window=window)
        committed = g.stamp(g.floor, (), clean=False)  # the takeover commit
        g.acknowledged(committed.high)
        handed = g.take(messages(plan.start, count - plan.start))
        killed = False
        done = plan.start
        while g.quarantine is not None and not killed:
            quarantine = g.quarantine
            head = g.withheld[0].offset() if g.withheld else None
            step = quarantine.step(head, done, position=count)
            if step is Step.END:
                g.end_quarantine()
                committed = g.stamp(done, (), clean=False)
                g.acknowledged(committed.high)
                handed = g.release()
                break
            assert head is not None
            if step is Step.DEAD:
                g.withheld.popleft()
                quarantine.handed(head, head)
                dead.append(head)
                done = head + 1
                continue
            size = quarantine.window_size(head)
            group = [g.withheld.popleft() for _ in range(min(size, len(g.withheld)))]
            group_offsets = [o for o in offsets(group) if o < quarantine.until]
            assert len(group_offsets) == len(group)
            g.window(head, quarantine.strikes_for(head) if len(group) == 1 else 0)
            quarantine.handed(head, group_offsets[-1])
            committed = g.stamp(head, (), clean=False)
            runs += group_offsets
            killed = bool(poison & set(group_offsets))  # the mark committed is what's left
            done = group_offsets[-1] + 1
        if killed:
            continue
        runs += offsets(handed)
        if poison & set(offsets(handed)):
            continue  # killed with everything running
        return runs, dead, owner
    raise AssertionError("the partition never drained")


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_a_poison_pill_runs_unsuspected_then_in_a_group_then_alone_once_per_strike(
    limit: int,
) -> None:
    runs, dead, owners = replay(41, {20}, limit)
    assert runs.count(20) == 2 + limit
    assert dead == [20]
    # The first owner, the one whose window held it, one per strike, and the one that drains.
    assert owners == 3 + limit
    assert set(range(41)) - {20} <= set(runs)


def test_a_poison_pill_that_is_the_first_suspect_runs_alone_at_once() -> None:
    runs, dead, owners = replay(41, {0}, 2)
    assert runs.count(0) == 1 + 2
    assert dead == [0]
    assert owners == 4


def test_two_poison_pills_on_one_partition_are_both_dead_lettered() -> None:
    runs, dead, _ = replay(30, {5, 17}, 2)
    assert dead == [5, 17]
    assert set(range(30)) - {5, 17} <= set(runs)


def test_a_crash_that_no_job_caused_costs_a_few_windows_not_a_job_at_a_time() -> None:
    quarantine = Quarantine(until=4000, offset=0, strikes=0, limit=3, alone=0, cap=256)
    windows, done = 0, 0
    while quarantine.step(done, done) is Step.RUN:
        last = min(done + quarantine.window_size(done), 4000) - 1
        quarantine.handed(done, last)
        windows += 1
        done = last + 1
    assert windows == 9 + (4000 - 511 + 255) // 256  # 1, 2, 4 ... 256, then 256 at a time


# -- the consumer thread's glue, against a fake consumer -------------------------------------


class FakeConsumer:
    """Just enough of librdkafka: committed marks with their metadata, watermarks, pauses."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.marks: dict[tuple[str, int], TopicPartition] = {}
        self.commits: list[tuple[bool, CommitMark]] = []
        self.paused: set[tuple[str, int]] = set()
        self.watermarks = (0, 0)
        self.position_at = -1001

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [
            self.marks.get((tp.topic, tp.partition), TopicPartition(tp.topic, tp.partition, -1001))
            for tp in tps
        ]

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        for tp in offsets:
            self.marks[(tp.topic, tp.partition)] = tp
            self.commits.append((asynchronous, CommitMark.decode(tp.offset, tp.metadata)))
        return offsets

    def get_watermark_offsets(
        self, tp: TopicPartition, timeout: float = 0, cached: bool = False
    ) -> tuple[int, int]:
        return self.watermarks

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.position_at) for tp in tps]

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, tps: list[TopicPartition]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in tps}


class ImmediateLoop:
    def call_soon_threadsafe(self, callback: Callable[..., Any], *args: Any) -> None:
        callback(*args)


class Side:
    """The loop side: records what it is handed and dead-letters."""

    def __init__(self) -> None:
        self.loop = ImmediateLoop()
        self.handed: list[int] = []
        self.poisoned: list[tuple[int, str]] = []
        self.finished_jobs = 0

    def on_batch(self, batch: Any) -> None:
        self.handed += [m.offset() for _, group in batch for m in group]

    def on_poison(self, state: PartitionState, message: Message, error: PoisonPillError) -> None:
        self.poisoned.append((message.offset(), str(error)))  # type: ignore[arg-type]

    def on_assigned(self, states: Any) -> None:
        return None

    def on_share(self, owned: Any, total: Any) -> None:
        return None

    async def revoke(self, states: Any, *, lost: bool) -> None:
        return None

    def on_checked(self) -> None:
        return None

    def on_burst_drained(self) -> None:
        return None

    def on_consumer_failed(self, exc: BaseException) -> None:
        return None


def take_over(
    previous: CommitMark | None, end: int, **worker: Any
) -> tuple[ConsumerThread, FakeConsumer, Side, PartitionState]:
    side = Side()
    made: list[FakeConsumer] = []

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        made.append(FakeConsumer(conf))
        return made[0]

    thread = ConsumerThread(
        settings=Settings(namespace="ns", worker=worker),
        group_id="ns.workers",
        topics={TOPIC: (Priority.DEFAULT, 0)},
        side=side,  # type: ignore[arg-type]
        metrics=WorkerMetrics(),
        consumer_factory=factory,  # type: ignore[arg-type]
    )
    fake = made[0]
    fake.watermarks = (0, end)
    if previous is not None:
        fake.marks[(TOPIC, 0)] = TopicPartition(
            TOPIC, 0, previous.offset, metadata=previous.encode()
        )
    state = PartitionState(TOPIC, 0, Priority.DEFAULT, 0)
    thread.states[(TOPIC, 0)] = state
    thread.assignment.add([state])
    fake.paused.add((TOPIC, 0))
    thread.assignment.load(resume=True)
    return thread, fake, side, state


def test_a_new_owner_commits_its_mark_synchronously_before_fetching() -> None:
    thread, fake, side, state = take_over(None, 50, poison_deliveries=3, consume_batch=5)
    assert fake.commits == [(False, CommitMark(0, dirty=True, high=10))]
    assert fake.paused == set()
    thread._hand(messages(0, 12))
    assert side.handed == list(range(10))  # the rest waits for a longer lease
    assert state.handed == 12  # counted all the same: flow control and commits see them
    thread._poison.step()
    asynchronous, renewal = fake.commits[-1]
    assert asynchronous
    assert renewal.high == 12 + 10
    thread._committer.on_commit(None, [fake.marks[(TOPIC, 0)]])  # Kafka acknowledges it
    thread._poison.step()
    assert side.handed == list(range(12))


def test_a_lease_half_used_grows_in_the_next_scheduled_commit_without_one_of_its_own() -> None:
    thread, fake, side, _ = take_over(None, 50, poison_deliveries=3, consume_batch=5)
    thread._hand(messages(0, 6))  # the lease covers offsets below 10: more than half used
    assert side.handed == list(range(6))
    thread._poison.step()
    assert len(fake.commits) == 1  # only the new owner's mark: no commit pushed for the lease
    thread._committer.commit(thread.states.values(), 0.0)  # the next scheduled one
    asynchronous, scheduled = fake.commits[-1]
    assert asynchronous
    assert scheduled.high == 6 + 10  # it carries the longer lease
    thread._committer.on_commit(None, [fake.marks[(TOPIC, 0)]])
    thread._hand(messages(6, 10))
    assert side.handed == list(range(16))  # none waited


def test_after_a_crash_the_suspects_run_in_windows_each_behind_a_synchronous_commit() -> None:
    previous = CommitMark(3, dirty=True, high=9, strikes=1)
    thread, fake, side, state = take_over(previous, 50, poison_deliveries=3)
    assert fake.commits == [(False, CommitMark(3, dirty=True, high=9, strikes=1))]
    assert thread._metrics.quarantined == 1
    thread._hand(messages(3, 8))
    assert side.handed == []
    thread._poison.step()
    assert side.handed == [3]  # alone, behind its second strike
    assert fake.commits[-1] == (False, CommitMark(3, dirty=True, high=9, strikes=2, window=4))
    thread._poison.step()
    assert side.handed == [3]  # 3 is still running
    state.commit_offset = 4
    thread._poison.step()
    assert side.handed == [3, 4, 5]  # then two together
    assert fake.commits[-1] == (False, CommitMark(4, dirty=True, high=9, window=6))
    state.commit_offset = 5
    thread._poison.step()
    assert side.handed == [3, 4, 5]  # until both are done
    state.commit_offset = 6
    thread._poison.step()
    assert side.handed == [3, 4, 5, 6, 7, 8]  # three left of the suspects
    state.commit_offset = 9
    thread._poison.step()  # 9 is past the suspects: back to normal, strikes reset
    assert side.handed == list(range(3, 11))
    assert fake.commits[-1][1] == CommitMark(9, dirty=True, high=11 + 2000)
    assert thread._metrics.quarantined == 0


def test_the_group_that_ran_when_the_owner_died_runs_one_at_a_time() -> None:
    previous = CommitMark(3, dirty=True, high=9, window=6)
    thread, fake, side, state = take_over(previous, 50, poison_deliveries=3)
    thread._hand(messages(3, 6))
    for offset in (3, 4, 5):
        thread._poison.step()
        assert side.handed[-1] == offset
        assert fake.commits[-1][1].window == 6  # the rest of the group stays suspect
        state.commit_offset = offset + 1
    thread._poison.step()
    assert side.handed == [3, 4, 5, 6]  # windows grow again from 1


def test_a_job_with_enough_strikes_is_dead_lettered_not_run() -> None:
    previous = CommitMark(3, dirty=True, high=5, strikes=2)
    thread, _, side, state = take_over(previous, 50, poison_deliveries=2)
    thread._hand(messages(3, 3))
    thread._poison.step()
    assert side.poisoned == [(3, "killed its worker 2 times while running alone on its partition")]
    assert side.handed == []
    assert thread._metrics.poison_pills == 1
    state.commit_offset = 4  # moved to the DLQ
    thread._poison.step()
    assert side.handed == [4]


def test_a_clean_previous_owner_means_no_quarantine_and_clean_marks_at_the_end() -> None:
    thread, fake, side, state = take_over(CommitMark(3, high=20), 50, poison_deliveries=3)
    thread._hand(messages(3, 4))
    assert side.handed == [3, 4, 5, 6]
    state.commit_offset = 7
    fake.position_at = 7
    thread._committer.commit(thread.states.values(), 0.0, sync=True, clean=True)
    last = fake.commits[-1][1]
    assert (last.offset, last.dirty, last.strikes) == (7, False, 0)


# -- several quarantined partitions in one process -------------------------------------------


class PartitionSide(Side):
    """Records what it is handed as (partition, offset)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list[tuple[int, int]] = []

    def on_batch(self, batch: Any) -> None:
        super().on_batch(batch)
        self.runs += [(state.partition, m.offset()) for state, group in batch for m in group]


def take_over_partitions(
    previous: dict[int, CommitMark], end: int, **worker: Any
) -> tuple[ConsumerThread, FakeConsumer, PartitionSide, dict[int, PartitionState]]:
    """A new owner of several partitions of one topic, each with its previous mark."""
    side = PartitionSide()
    made: list[FakeConsumer] = []

    def factory(conf: dict[str, Any]) -> FakeConsumer:
        made.append(FakeConsumer(conf))
        return made[0]

    thread = ConsumerThread(
        settings=Settings(namespace="ns", worker=worker),
        group_id="ns.workers",
        topics={TOPIC: (Priority.DEFAULT, 0)},
        side=side,  # type: ignore[arg-type]
        metrics=WorkerMetrics(),
        consumer_factory=factory,  # type: ignore[arg-type]
    )
    fake = made[0]
    fake.watermarks = (0, end)
    states: dict[int, PartitionState] = {}
    for partition, mark in previous.items():
        fake.marks[(TOPIC, partition)] = TopicPartition(
            TOPIC, partition, mark.offset, metadata=mark.encode()
        )
        state = states[partition] = PartitionState(TOPIC, partition, Priority.DEFAULT, 0)
        thread.states[(TOPIC, partition)] = state
        thread.assignment.add([state])
    thread.assignment.load(resume=True)
    return thread, fake, side, states


def last_mark(fake: FakeConsumer, partition: int) -> CommitMark:
    tp = fake.marks[(TOPIC, partition)]
    return CommitMark.decode(tp.offset, tp.metadata)


def test_suspects_of_two_quarantined_partitions_never_run_at_the_same_time() -> None:
    # The previous owner died running both partitions: an innocent 3 s job at offset 0 of one,
    # a poison pill at offset 0 of the other. Run together, one death would strike both.
    dirty = CommitMark(0, dirty=True, high=3)
    thread, fake, side, states = take_over_partitions({0: dirty, 1: dirty}, 3, poison_deliveries=3)
    assert thread._metrics.quarantined == 2
    thread._hand(messages(0, 3, partition=0) + messages(0, 3, partition=1))
    thread._poison.step()
    [(first, offset)] = side.runs
    other = 1 - first
    assert offset == 0
    assert last_mark(fake, first).strikes == 1  # alone, behind its strike
    thread._poison.step()
    thread._poison.step()
    assert side.runs == [(first, 0)]  # the other partition waits while that one runs
    assert last_mark(fake, other) == CommitMark(0, dirty=True, high=3)  # nothing to strike
    states[first].commit_offset = 1
    thread._poison.step()
    assert side.runs == [(first, 0), (other, 0)]  # its turn: its suspect runs alone now
    assert last_mark(fake, other).strikes == 1
    assert last_mark(fake, first).strikes == 0  # the first one's next window is not out
    states[other].commit_offset = 1
    thread._poison.step()
    assert side.runs[2:] == [(first, 1), (first, 2)]  # turns alternate, windows grow
    states[first].commit_offset = 3
    thread._poison.step()
    assert side.runs[4:] == [(other, 1), (other, 2)]
    states[other].commit_offset = 3
    thread._poison.step()
    assert thread._metrics.quarantined == 0


def test_a_death_strikes_only_the_suspect_that_was_running() -> None:
    # Replay owner after owner: the poison pill at offset 0 of partition 1 kills whoever runs
    # it; the innocent job at offset 0 of partition 0 finishes whenever it runs.
    marks = {0: CommitMark(0, dirty=True, high=2), 1: CommitMark(0, dirty=True, high=2)}
    limit = 3
    dead_lettered: list[int] = []
    for _owner in range(10):
        thread, fake, side, states = take_over_partitions(marks, 2, poison_deliveries=limit)
        thread._hand(messages(0, 2, partition=0) + messages(0, 2, partition=1))
        died = False
        for _ in range(20):
            thread._poison.step()
            if (1, 0) in side.runs:
                died = True  # os._exit: the marks committed so far are what is left
                break
            if side.poisoned:
                dead_lettered += [offset for offset, _ in side.poisoned]
                side.poisoned.clear()
                states[1].commit_offset = max(states[1].commit_offset, 1)
            for partition, offset in side.runs:
                states[partition].commit_offset = max(states[partition].commit_offset, offset + 1)
        marks = {p: last_mark(fake, p) for p in (0, 1)}
        if not died:
            break
    assert dead_lettered == [0]
    # The innocent job was never struck: it ran, alone among the suspects, to its end.
    assert marks[0].offset == 2


class _Refusing:
    """A committer whose synchronous commits Kafka refuses (a rebalance in progress)."""

    def push(self, states: object, *, sync: bool) -> bool:
        return False


class _Ends:
    def get_watermark_offsets(
        self, tp: TopicPartition, *args: Any, **kwargs: Any
    ) -> tuple[int, int]:
        return 0, 50


def test_a_quarantine_not_secured_is_not_counted_off_when_its_partition_goes() -> None:
    """The gauge of quarantined partitions counts one up once the new owner's mark is in
    Kafka (secure()), but counted one off at every revocation of a planned quarantine: one
    whose mark Kafka refused went below zero, and hid the next real quarantine."""
    from pipeline_worker.recovery.poison import PoisonWatch

    topic = "ns.jobs.default"
    state = PartitionState(topic, 0, Priority.DEFAULT, 0)
    metrics = WorkerMetrics()
    watch = PoisonWatch(
        deliveries=3, lease=10, window=64,
        consumer=_Ends(),  # type: ignore[arg-type]
        committer=_Refusing(),  # type: ignore[arg-type]
        states={(topic, 0): state}, metrics=metrics, deliver=lambda batch: None,
        dead_letter=None,
    )  # fmt: skip
    dirty = CommitMark(3, dirty=True, high=9)  # its previous owner died
    watch.plan(state, TopicPartition(topic, 0, 3, metadata=dirty.encode()))
    assert not watch.secure([state])
    assert metrics.quarantined == 0
    watch.forget([state])  # revoked before secure() could be tried again
    assert metrics.quarantined == 0
