"""What a commit carries and when it is made, against a fake consumer: never past messages held
until their partition is read back, marks read only for the offset they were written for and
never fatally, transactions after the newest asynchronous commit, the finished map between two
readings, and skips only where consumption started at the mark."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from pipeline import Pipeline, Priority, Settings
from pipeline.testing import InMemoryTransport
from pipeline_worker import OutcomeKind
from pipeline_worker._work import PartitionState
from pipeline_worker.commit import committer as committer_module
from pipeline_worker.commit import positions
from pipeline_worker.commit.finished import finished_runs
from pipeline_worker.commit.marks import CommitMark, fit, max_moved, promised
from pipeline_worker.commit.moves import Mover
from pipeline_worker.commit.offsetmap import Skips
from pipeline_worker.intake.consumer import ConsumerThread
from pipeline_worker.route.policy import Record

from ..test_transactions import FakeProducer
from .support import Harness
from .test_worker_consumer import (
    TOPIC,
    FakeConsumer,
    consumer_thread,
    flush,
    loop,
    messages,
    own,
)

__all__ = ["loop"]  # the fixture

END = KafkaError(KafkaError._PARTITION_EOF)


def _burst_assigned(loop: asyncio.AbstractEventLoop) -> tuple[ConsumerThread, FakeConsumer, Any]:
    """A burst worker assigned partition 0, which delivered offsets 0..2 and its end before the
    pause took hold (held: not read back yet); the consumer's position is past them."""
    thread, fake, side = consumer_thread(
        loop, burst=True, kafka_consumer={"group.protocol": "classic"}
    )
    fake.group_committed[(TOPIC, 0)] = 0  # the previous owner's commit point
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    thread._hand([*messages(0, 0, 3), Message(topic=TOPIC, partition=0, offset=3, error=END)])
    fake.positions[(TOPIC, 0)] = 3
    return thread, fake, side


def test_a_scheduled_commit_does_not_pass_messages_held_until_the_read_back(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = _burst_assigned(loop)
    real = fake.committed
    calls: list[int] = []

    def committed(tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        calls.append(1)
        if len(calls) == 1:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out"))
        return real(tps, timeout)

    fake.committed = committed  # type: ignore[method-assign]
    thread._chores(0.0, idle=False)  # the read-back fails once; the scheduled commit is due
    assert fake.group_committed[(TOPIC, 0)] == 0
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    flush(loop)
    assert side.batches == []
    assert fake.group_committed[(TOPIC, 0)] == 0, "the next owner must run offsets 0..2"


def test_a_revocation_before_the_read_back_does_not_pass_held_messages(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = _burst_assigned(loop)
    thread.rebalance.on_revoke(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    flush(loop)
    assert side.batches == []
    assert fake.group_committed[(TOPIC, 0)] == 0


def test_the_read_back_commits_its_mark_where_the_held_messages_start(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, side = _burst_assigned(loop)
    thread._chores(time.monotonic(), idle=False)  # read back: the new owner's mark, then 0..2
    flush(loop)
    assert [m.offset() for _, group in side.batches[0] for m in group] == [0, 1, 2]
    assert fake.group_committed[(TOPIC, 0)] == 0, "not the position, past jobs not run yet"
    [state] = thread.states.values()
    assert state.read_back
    assert not positions.idle(state), "three jobs handed and not finished"


def test_a_partition_read_back_after_intake_stopped_is_not_committed_past_its_held_messages(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, _ = _burst_assigned(loop)
    thread.intake_stopped = True
    thread._chores(time.monotonic(), idle=False)  # read back, but not resumed: held dropped
    thread._final_commit()
    assert fake.group_committed[(TOPIC, 0)] == 0


def test_a_mark_is_read_only_at_the_offset_it_was_written_for() -> None:
    written = CommitMark(
        1000, (1004,), dirty=True, high=3000, strikes=3, finished=((1001, 1010),)
    ).encode()
    assert CommitMark.decode(1000, written).strikes == 3
    # A tool moved the committed offset and kept the metadata (MirrorMaker 2's offset sync):
    # its skips and strikes would land on other messages.
    for moved_to in (950, 963, 1001):
        assert CommitMark.decode(moved_to, written) == CommitMark(moved_to)
        assert promised(moved_to, written) == -1
    assert CommitMark.decode(5, '{"v":1,"o":"5","m":[2]}') == CommitMark(5)
    assert CommitMark.decode(5, '{"v":1,"o":true,"m":[2]}') == CommitMark(5)
    # Marks of the previous release carry no offset: read as they always were.
    assert CommitMark.decode(1000, '{"v":1,"m":[4],"d":1,"s":3}').strikes == 3


def test_a_worst_case_envelope_fits_the_smallest_metadata_limit() -> None:
    base = 2**63 - 10**9
    moved = tuple(base + 99_999_999 * (i + 1) for i in range(max_moved(1024)))
    mark = CommitMark(base, moved, True, base + 10**9, 999, base + 10**8, ((base + 1, base + 2),))
    text, _ = fit(mark, 1024)
    assert len(text) <= 1024
    assert CommitMark.decode(base, text).moved == moved


@pytest.mark.parametrize(
    "metadata",
    [
        "[" * 1100 + "]" * 1100,
        '{"v":1,"x":' + "[" * 1500 + "]" * 1500 + "}",
        '{"v":1,"h":' + "[" * 2000,
        " " + '{"v":1,"m":[2]}',
    ],
    ids=["nested", "nested-in-a-mark", "cut-short", "not-how-a-mark-begins"],
)
def test_metadata_that_cannot_be_read_is_an_empty_mark(metadata: str) -> None:
    assert CommitMark.decode(100, metadata) == CommitMark(100)
    assert promised(100, metadata) == -1


def test_deeply_nested_metadata_does_not_stop_the_consumer_thread(
    loop: asyncio.AbstractEventLoop,
) -> None:
    thread, fake, _ = consumer_thread(loop, kafka_consumer={"group.protocol": "classic"})
    nested = "[" * 1100 + "]" * 1100  # 2,200 bytes: within offset.metadata.max.bytes

    def committed(tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 42, metadata=nested) for tp in tps]

    fake.committed = committed  # type: ignore[method-assign]
    thread.rebalance.on_assign(fake, [TopicPartition(TOPIC, 0)])  # type: ignore[arg-type]
    thread._chores(time.monotonic(), idle=True)
    [state] = thread.states.values()
    assert state.read_back
    assert state.skips is None
    assert fake.group_committed[(TOPIC, 0)] == 42


def test_no_transaction_opens_while_the_newest_asynchronous_commit_is_unanswered(
    loop: asyncio.AbstractEventLoop,
) -> None:
    """An older commit unanswered for ``IN_FLIGHT_WAIT_S`` lets a new one go; that one, just
    sent, still keeps the transaction closed: it could land after the transaction's offsets
    and put back a mark without the move."""
    producer = FakeProducer()
    mover = Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]
    thread, fake, _ = consumer_thread(loop, mover=mover)
    [state] = own(thread, 0)
    thread._hand(messages(0, 0, 10))
    committer = thread._committer
    state.commit_offset = 2
    committer.commit(thread.states.values(), time.monotonic())  # A: never answered
    committer._started[0] -= committer_module.IN_FLIGHT_WAIT_S + 1
    state.commit_offset = 3
    committer.commit(thread.states.values(), time.monotonic())  # B: sent now
    assert len(fake.sent) == 2
    assert committer.awaiting(time.monotonic())
    written: list[bool] = []
    mover.submit((TOPIC, 0), 5, [Record("ns.dlq", b"5", None)], written.append, state=state)
    thread._chores(time.monotonic(), idle=True)
    assert not mover.open
    committer.on_commit(None, fake.sent[0])  # A answered: B still is not
    assert committer.awaiting(time.monotonic())
    committer.on_commit(None, fake.sent[1])
    thread._chores(time.monotonic(), idle=True)
    assert mover.open, "B answered: the move goes"


def test_the_map_between_two_readings_keeps_the_previous_owners_finished_offsets() -> None:
    state = PartitionState(TOPIC, 0, Priority.DEFAULT, 0)
    state.committed = 100
    state.skips = Skips(((101, 200), (300, 400)))  # 100 was running when its owner died
    state.tracker.add(100)  # a long job
    before = finished_runs(state, 100, (), state.tracker.finished_count)
    assert before == ((101, 200), (300, 400))
    state.map_next = time.monotonic() + 60  # the last reading was slow: the next waits
    for offset in range(101, 301):  # the loop passes the skipped ones, runs 200..299
        state.tracker.add(offset)
        if state.skips.covers(offset):
            state.tracker.finish(offset)
    after = finished_runs(state, 100, (), state.tracker.finished_count)
    assert after == ((101, 200), (300, 400))


def _app() -> Pipeline:
    return Pipeline(transport=InMemoryTransport())


@pytest.mark.parametrize(
    ("start", "ran"), [(10, [10, 14, 15]), (8, list(range(8, 16)))], ids=["at", "below"]
)
def test_skips_apply_only_where_consumption_started_at_the_committed_offset(
    start: int, ran: list[int]
) -> None:
    """Consumed from below the committed offset (it was out of range: the log was truncated or
    the topic created again), the offsets the mark lists may be other messages now."""

    async def main() -> list[int]:
        app = _app()

        @app.job("quick")
        async def quick() -> None:
            return None

        h = Harness(app)
        h.partition.committed = 10
        h.partition.skips = Skips(((11, 14),))
        h.feed(*(h.message("quick", offset=offset) for offset in range(start, 16)))
        outcomes = await h.recorder.wait_for(len(ran))
        assert {o.kind for o in outcomes} == {OutcomeKind.SUCCEEDED}
        return sorted(o.offset for o in outcomes)

    assert asyncio.run(asyncio.wait_for(main(), 20)) == ran
