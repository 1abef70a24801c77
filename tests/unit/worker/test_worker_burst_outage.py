"""A ``--burst`` run and the final commit while Kafka does not answer: a partition whose moves are
in no transaction (stranded) is left out of a synchronous commit, so the run is not drained and
the final commit is not done; and an idle turn of a burst run does not wait on the cluster's
metadata while Kafka is unreachable."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from pipeline_worker._work import PartitionState
from pipeline_worker.intake import shutdown
from pipeline_worker.intake.consumer import ConsumerThread

from ..test_transactions import OutageProducer
from .test_worker_consumer import (
    FakeConsumer,
    FakeSide,
    consumer_thread,
    flush,
    loop,
    messages,
    own,
)
from .test_worker_moves_outage import P0, mover_on, submit

__all__ = ["loop"]  # the fixture


class Stranded(SimpleNamespace):
    thread: ConsumerThread
    fake: FakeConsumer
    side: FakeSide
    producer: OutageProducer
    state: PartitionState


def stranded(loop: asyncio.AbstractEventLoop) -> Stranded:
    """A burst run whose only partition is done, but for the move of its job at offset 1: in
    the open transaction when its coordinator stopped answering, then in none."""
    producer = OutageProducer()
    mover = mover_on(producer, loop)
    thread, fake, side = consumer_thread(loop, mover=mover, burst=True)
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    fake.partitions = 1
    [state] = own(thread, 0)
    thread._hand(messages(0, 0, 5))
    fake.positions = {P0: 5}
    done: list[int] = []
    submit(mover, P0, 1, done)
    thread._drain_moves()
    flush(loop)
    assert done == [1]
    state.taken = state.handed
    state.commit_offset = 5
    state.at_end = True
    thread.rebalance.assigned_once = True
    thread._cluster.share_changed = True
    producer.outage()
    return Stranded(thread=thread, fake=fake, side=side, producer=producer, state=state)


def idle_turns(thread: ConsumerThread, now: float, turns: int) -> float:
    for _ in range(turns):
        thread._burst_watch.recheck_now()
        thread._chores(now, idle=True)
        now += 1.0
    return now


def committed_of_p0(run: Stranded) -> list[int]:
    sent = [tp.offset for offsets in run.fake.sent for tp in offsets if tp.partition == 0]
    in_txn = run.producer.sent_offsets
    return sent + [tp.offset for offsets, _ in in_txn for tp in offsets if tp.partition == 0]


def test_a_burst_is_not_drained_while_a_partition_is_stranded_and_is_once_it_is_committed(
    loop: asyncio.AbstractEventLoop,
) -> None:
    run = stranded(loop)
    now = idle_turns(run.thread, 1000.0, 4)
    flush(loop)
    assert run.thread._mover is not None
    assert run.thread._mover.stranded() == {P0}
    assert committed_of_p0(run) == []
    assert not run.side.drained.is_set(), "drained (exit 0) though P0 was never committed"
    run.producer.down = frozenset()  # Kafka answers again: the move is written again
    idle_turns(run.thread, now, 2)
    assert run.side.drained.wait(5)
    assert [value for _, value in run.producer.committed[0]] == [b"0@1"]
    assert committed_of_p0(run) == [5]


def test_a_synchronous_commit_that_left_a_stranded_partition_out_is_not_done(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    run = stranded(loop)
    idle_turns(run.thread, 1000.0, 1)  # the commit fails: its move is in no transaction
    [other] = own(run.thread, 1)
    other.commit_offset = 3
    committer = run.thread._committer
    with caplog.at_level(logging.WARNING, "pipeline.worker.commits"):
        assert not committer.commit([run.state, other], 2000.0, sync=True)
    assert run.fake.commits[-1] == (False, [("ns.jobs.default", 1, 3)])  # the rest goes
    assert "not committing ns.jobs.default[0]" in caplog.text
    assert not committer.commit([run.state], 2000.0, sync=True)  # nothing to send: not done


def test_the_final_commit_does_not_pass_a_stranded_partition_as_committed(
    loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = stranded(loop)
    idle_turns(run.thread, 1000.0, 2)  # the burst check logged the skip already
    clock = [5000.0]

    def poll(timeout: float) -> None:
        clock[0] += timeout

    monkeypatch.setattr(shutdown, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    with caplog.at_level(logging.WARNING):
        shutdown.final_commit(
            run.thread._committer,
            run.thread.states,
            run.thread.health,
            moves=True,
            drain_moves=run.thread._drain_moves,
            poll=poll,
        )
    assert "not committing ns.jobs.default[0]" in caplog.text
    assert "could not commit the final offsets" in caplog.text
    assert committed_of_p0(run) == []


def test_the_final_commit_writes_the_moves_again_once_kafka_answers_and_commits_them(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its retries only polled: a partition whose moves were in no transaction stayed out of
    the commit for the whole 10 s, even with Kafka answering again after the first try."""
    run = stranded(loop)
    idle_turns(run.thread, 1000.0, 2)
    clock = [5000.0]

    def poll(timeout: float) -> None:
        clock[0] += timeout
        run.producer.down = frozenset()  # Kafka answers again, after the first try

    monkeypatch.setattr(shutdown, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    shutdown.final_commit(
        run.thread._committer,
        run.thread.states,
        run.thread.health,
        moves=True,
        drain_moves=run.thread._drain_moves,
        poll=poll,
    )
    assert [value for _, value in run.producer.committed[0]] == [b"0@1"]
    assert committed_of_p0(run) == [5]


def test_an_idle_burst_turn_asks_for_no_partition_counts_while_kafka_is_unreachable(
    loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread, fake, side = consumer_thread(loop, burst=True)
    [state] = own(thread, 0)
    state.at_end = True
    thread.rebalance.assigned_once = True
    thread._cluster.share_changed = True  # as after an assignment
    monkeypatch.setattr(thread.health, "down", True)
    now = idle_turns(thread, 1000.0, 3)
    assert fake.topic_lists == [], "list_topics blocks for its timeout while Kafka is down"
    flush(loop)
    assert not side.drained.is_set()  # the partition counts are not known yet
    monkeypatch.setattr(thread.health, "down", False)
    idle_turns(thread, now, 1)
    counted = [topic for topic in fake.topic_lists if ".jobs." in topic]
    assert counted == ["ns.jobs.default"]  # besides the topics the moves write, checked once
    assert side.drained.wait(5)
