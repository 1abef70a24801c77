"""Finished offsets above a stuck commit point: committed as they finish, and a partition whose
map would not fit in the commit metadata takes no new jobs until it does."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from pipeline import Priority, Settings
from pipeline_worker._metrics import WorkerMetrics
from pipeline_worker._work import PartitionState
from pipeline_worker.commit import finished as finished_module
from pipeline_worker.commit import offsetmap
from pipeline_worker.commit.marks import CommitMark
from pipeline_worker.intake.consumer import ConsumerThread

from .test_worker_consumer import TOPIC, FakeConsumer, loop

__all__ = ["loop"]  # the fixture


@pytest.fixture(autouse=True)
def fresh_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read the tracker at every commit, however long it takes (see the last test)."""
    monkeypatch.setattr(finished_module, "MAP_COST_FACTOR", 0.0)


class MarkingConsumer(FakeConsumer):
    """Keeps the marks committed, too, and acknowledges asynchronous commits at once."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.marks: list[CommitMark] = []

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        self.marks += [CommitMark.decode(tp.offset, tp.metadata) for tp in offsets]
        done = super().commit(offsets=offsets, asynchronous=asynchronous)
        if asynchronous:
            self.conf["on_commit"](None, offsets)
        return done


def start(
    loop: asyncio.AbstractEventLoop, *partitions: int
) -> tuple[ConsumerThread, MarkingConsumer, list[PartitionState]]:
    from .test_worker_consumer import FakeSide

    made: list[MarkingConsumer] = []

    def factory(conf: dict[str, Any]) -> MarkingConsumer:
        made.append(MarkingConsumer(conf))
        return made[0]

    thread = ConsumerThread(
        settings=Settings(namespace="ns"),
        group_id="ns.workers",
        topics={TOPIC: (Priority.DEFAULT, 0)},
        side=FakeSide(loop),
        metrics=WorkerMetrics(),
        consumer_factory=factory,  # type: ignore[arg-type]
    )
    states = [PartitionState(TOPIC, p, Priority.DEFAULT, 0) for p in partitions]
    for state in states:
        state.read_back = True  # as if assigned and read back
        thread.states[(TOPIC, state.partition)] = state
    return thread, made[0], states


def deliver(state: PartitionState, count: int) -> None:
    for offset in range(count):
        state.tracker.add(offset)
    state.handed = count
    state.handed_next = count
    state.commit_offset = 0


def finish(state: PartitionState, offsets: Iterable[int]) -> None:
    for offset in offsets:
        watermark = state.tracker.finish(offset)
        assert watermark is not None
        state.commit_offset = watermark


def test_jobs_finished_behind_a_long_one_are_committed_in_its_map(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, [state] = start(loop, 0)
    deliver(state, 5000)
    thread._committer.commit(thread.states.values(), 0.0)
    assert fake.marks == [CommitMark(0, dirty=True)]
    finish(state, range(1, 4000))  # offset 0 still runs
    thread._committer.commit(thread.states.values(), 1.0)
    assert fake.marks[-1] == CommitMark(0, dirty=True, finished=((1, 4000),))
    thread._committer.commit(thread.states.values(), 2.0)
    assert len(fake.marks) == 2, "nothing finished since: nothing to commit"
    finish(state, [4500])
    thread._committer.commit(thread.states.values(), 3.0)
    assert fake.marks[-1].finished == ((1, 4000), (4500, 4501))
    assert not fake.paused, "a map this small holds nothing"


def test_a_partition_whose_map_outgrows_the_metadata_takes_no_new_jobs_until_it_fits(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, [held, other] = start(loop, 0, 1)
    metrics = thread._metrics
    deliver(held, 40_000)
    deliver(other, 10)
    rng = random.Random(3)
    finish(held, [o for o in range(1, 40_000) if rng.random() < 0.5])  # scattered: ~5 KB
    finish(other, range(10))
    thread._committer.commit(thread.states.values(), 0.0)
    assert fake.paused == {(TOPIC, 0)}
    assert held.paused
    assert not other.paused
    assert (metrics.map_held, metrics.map_holds) == (1, 1)
    assert metrics.map_cut == 1, "the map did not fit whole: it was cut"
    assert len(fake.marks[0].encode()) <= 4096
    # A drained buffer does not resume a partition held for its map.
    held.taken = held.handed
    thread._flow.pause_full([held])
    thread._flow.paused.add(held)
    thread._flow.resume_drained()
    assert fake.paused == {(TOPIC, 0)}
    # The long job at the commit point ends: the map shrinks and the partition goes on.
    finish(held, range(0, 39_000))
    thread._committer.commit(thread.states.values(), 1.0)
    assert fake.paused == set()
    assert not held.paused
    assert (metrics.map_held, metrics.map_holds) == (0, 1)
    assert fake.marks[-1].offset == held.commit_offset
    assert offsetmap.count(fake.marks[-1].finished) > 0


def test_a_map_held_near_the_limit_is_held_before_it_must_be_cut(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, [state] = start(loop, 0)
    deliver(state, 40_000)
    rng = random.Random(5)
    # About 3.5 KB of scattered offsets: over three quarters of 4096, within the whole.
    finish(state, [o for o in range(1, 22_000) if rng.random() < 0.5])
    thread._committer.commit(thread.states.values(), 0.0)
    assert thread._metrics.map_cut == 0
    assert 3072 < len(fake.marks[-1].encode()) <= 4096
    assert fake.paused == {(TOPIC, 0)}


def test_a_held_partition_stays_paused_once_intake_stopped(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, [state] = start(loop, 0)
    flow = thread._flow
    flow.hold(state, True)
    assert fake.paused == {(TOPIC, 0)}
    flow.pause_all()  # shutdown
    flow.hold(state, False)
    flow.hold(state, True)
    flow.hold(state, False)
    assert fake.paused == {(TOPIC, 0)}
    assert state.paused


def test_a_map_that_is_slow_to_read_is_read_again_only_after_a_while(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hundreds of thousands of offsets finished behind a stuck job take tens of milliseconds
    to read: commits in between send the runs read last (finished all the same)."""
    monkeypatch.setattr(finished_module, "MAP_COST_FACTOR", 1e6)
    thread, fake, [state] = start(loop, 0)
    deliver(state, 300_000)
    finish(state, range(1, 200_000))
    thread._committer.commit(thread.states.values(), 0.0)
    assert fake.marks[-1].finished == ((1, 200_000),)
    assert state.map_next > 0, "that reading was slow: the next waits"
    finish(state, range(200_000, 250_000))
    thread._committer.commit(thread.states.values(), 1.0)
    assert fake.marks[-1].finished == ((1, 200_000),), "the runs read last, sent again"
    state.map_next = 0.0  # the wait is over
    thread._committer.commit(thread.states.values(), 2.0)
    assert fake.marks[-1].finished == ((1, 250_000),)


class InheritingConsumer(MarkingConsumer):
    """Answers ``committed`` with the marks a previous owner left (metadata included)."""

    def __init__(self, conf: dict[str, Any]) -> None:
        super().__init__(conf)
        self.left: dict[tuple[str, int], CommitMark] = {}
        self.ends = {(TOPIC, 0): (0, 60_000), (TOPIC, 1): (0, 60_000)}

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        found = []
        for tp in tps:
            mark = self.left.get((tp.topic, tp.partition))
            if mark is None:
                found.append(TopicPartition(tp.topic, tp.partition, -1001))
            else:
                found.append(TopicPartition(tp.topic, tp.partition, mark.offset, mark.encode()))
        return found


def assigned(
    loop: asyncio.AbstractEventLoop, left: dict[tuple[str, int], CommitMark]
) -> tuple[ConsumerThread, InheritingConsumer, list[PartitionState]]:
    """A consumer thread that was just assigned partitions 0 and 1, whose previous owner left
    ``left``; not read back yet."""
    from .test_worker_consumer import FakeSide

    made: list[InheritingConsumer] = []

    def factory(conf: dict[str, Any]) -> InheritingConsumer:
        made.append(InheritingConsumer(conf))
        made[0].left = left
        return made[0]

    thread = ConsumerThread(
        settings=Settings(namespace="ns", worker={"kafka_consumer": {"group.protocol": "classic"}}),
        group_id="ns.workers",
        topics={TOPIC: (Priority.DEFAULT, 0)},
        side=FakeSide(loop),
        metrics=WorkerMetrics(),
        consumer_factory=factory,  # type: ignore[arg-type]
    )
    fake = made[0]
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])  # type: ignore[arg-type]
    assert fake.paused == {(TOPIC, 0), (TOPIC, 1)}
    return thread, fake, sorted(thread.states.values(), key=lambda s: s.partition)


def near_the_limit() -> offsetmap.Runs:
    """About 3.5 KB of scattered finished offsets: over the hold fraction of 4096, within it."""
    rng = random.Random(5)
    return offsetmap.runs_of([o for o in range(1, 22_000) if rng.random() < 0.5])


def test_a_partition_read_back_while_its_map_is_held_stays_paused_until_the_map_fits(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit of its new owner's mark, made while a partition is read back, may hold it for
    its map: it stays paused once read back, while the other partition resumes as usual; the
    end of the hold resumes it (and would not before it is read back)."""
    thread, fake, [held, other] = assigned(loop, {})
    committer, flow = thread._committer, thread._flow
    over = {0}

    def hold(state: PartitionState, too_large: bool) -> None:
        flow.hold(state, too_large or state.partition in over)

    monkeypatch.setattr(committer, "_hold", hold)
    flow.hold(held, True)
    flow.hold(held, False)  # the end of a hold before it is read back resumes nothing
    assert fake.paused == {(TOPIC, 0), (TOPIC, 1)}
    thread._chores(0.0, idle=True)  # reads both back, commits their marks: 0 is held
    assert not thread.assignment.pending
    assert fake.paused == {(TOPIC, 0)}
    assert held.paused
    assert not other.paused
    assert (thread._metrics.map_held, thread._metrics.map_holds) == (1, 2)
    over.clear()  # the map fits again
    committer.push([held], sync=True)
    assert fake.paused == set()
    assert not held.paused
    assert thread._metrics.map_held == 0


def test_a_map_inherited_near_the_limit_does_not_stop_its_partition_from_fetching(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """A previous owner's finished offsets above the committed one shrink only as the partition
    fetches past them (its new owner's mark carries them meanwhile): a hold for them would
    pause the partition for good. Once the offsets it fetched itself outgrow the metadata, it is
    held as any other."""
    finished = near_the_limit()
    left = {(TOPIC, 0): CommitMark(0, finished=finished)}
    thread, fake, [inherited, other] = assigned(loop, left)
    thread._chores(0.0, idle=True)  # reads both back: the new owner's mark is committed
    assert not thread.assignment.pending
    assert fake.marks[0].finished == finished, "the new owner's mark carries the map on"
    assert len(fake.marks[0].encode()) > 3072
    assert fake.paused == set()
    assert not inherited.paused
    assert not other.paused
    assert thread._metrics.map_held == 0
    # It fetched through the inherited offsets and beyond; a job at the commit point is stuck
    # and its own finished offsets above make the map too large: it is held.
    for offset in range(40_000):
        inherited.tracker.add(offset)
    inherited.handed = inherited.handed_next = 40_000
    inherited.commit_offset = 0
    rng = random.Random(7)
    finish(inherited, [o for o in range(1, 40_000) if rng.random() < 0.5])
    thread._committer.commit(thread.states.values(), 1.0)
    assert fake.paused == {(TOPIC, 0)}
    assert inherited.paused
    assert (thread._metrics.map_held, thread._metrics.map_holds) == (1, 1)
