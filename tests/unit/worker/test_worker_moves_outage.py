"""The worker's moves while Kafka does not answer, against a producer that behaves as
librdkafka's does then (tests/unit/test_transactions.py's ``OutageProducer``): the consumer
thread gets back to polling within seconds, no move is lost, none is committed twice, and no
commit passes a job whose move is not in Kafka."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque

import pytest
from confluent_kafka import TopicPartition

from pipeline import Settings
from pipeline._transactions import STEP_TIMEOUT_S
from pipeline_worker.commit import moves
from pipeline_worker.commit.moves import TIMEOUT_S, Mover
from pipeline_worker.commit.movetxn import ABORTS_TOLD
from pipeline_worker.commit.txnconfig import transactional_config
from pipeline_worker.intake.consumer import ConsumerThread
from pipeline_worker.route.policy import Record

from ..test_transactions import FakeProducer, OutageProducer, abortable
from .test_worker_consumer import FakeConsumer, consumer_thread, flush, loop, messages, own

__all__ = ["loop"]  # the fixture

TOPIC = "ns.jobs.default"
P0 = (TOPIC, 0)
P1 = (TOPIC, 1)
META = object()
HEALTH_LIMIT_S = 15.0
"""``/healthz`` calls a consumer that has not polled for this long stuck (its minimum)."""


def mover_on(producer: OutageProducer, loop: asyncio.AbstractEventLoop) -> Mover:
    return Mover(Settings(namespace="ns"), loop, producer_factory=lambda conf: producer)  # type: ignore[arg-type,return-value]


def submit(mover: Mover, where: tuple[str, int], offset: int, done: list[int]) -> None:
    """A move of ``offset`` to the dead letters; once written, ``offset`` lands in ``done``."""
    record = Record("ns.dlq", f"{where[1]}@{offset}".encode(), None)
    mover.submit(where, offset, [record], functools.partial(_written, done, offset))


def _written(done: list[int], offset: int, ok: bool) -> None:
    if ok:
        done.append(offset)


def owned(where: tuple[str, int]) -> bool:
    return True


def offsets(*wheres: tuple[str, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p, 10) for t, p in wheres]


def values(producer: OutageProducer) -> list[list[bytes | None]]:
    return [[value for _, value in txn] for txn in producer.committed]


def test_the_moves_wait_one_short_timeout_per_call_and_the_step_is_not_retried_in_place() -> None:
    """The bound the consumer thread relies on: 5 s a call, one call a step (the thread's
    next turn, after a poll, is the retry)."""
    assert moves.TIMEOUT_S == STEP_TIMEOUT_S == 5.0
    assert moves.ATTEMPTS == 1


def test_moves_made_during_an_outage_wait_and_are_committed_once_kafka_answers(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = OutageProducer()
    mover = mover_on(producer, loop)
    done: list[int] = []
    submit(mover, P0, 3, done)
    mover.drain(owned, lambda w: 0)  # in the open transaction: Kafka is not asked yet
    producer.outage()
    waited = len(producer.waited)
    assert not mover.commit(offsets(P0), META, owned)
    # The offsets, then the abort, each waited one timeout: the thread polls again at once.
    assert producer.waited[waited:] == [
        ("send_offsets_to_transaction", STEP_TIMEOUT_S),
        ("abort_transaction", STEP_TIMEOUT_S),
    ]
    assert mover.stranded() == {P0}  # its move is in no transaction: P0 is not committed
    submit(mover, P1, 5, done)
    for _ in range(3):  # the thread's next turns while Kafka is down
        waited = len(producer.waited)
        assert not mover.drain(owned, lambda w: 0)
        assert producer.waited[waited:] == [("abort_transaction", STEP_TIMEOUT_S)]
        assert not mover.open
    assert "begin_transaction refused" not in producer.calls
    flush(loop)
    assert done == [3]  # the move made during the outage is not written: its job not finished
    producer.down = frozenset()
    assert mover.drain(owned, lambda w: 0)  # the abort ends, both moves go in a new one
    assert mover.commit(offsets(P0, P1), META, owned)
    assert values(producer) == [[b"0@3", b"1@5"]]
    flush(loop)
    assert done == [3, 5]


@pytest.mark.parametrize("outcome", ["committed", "aborted"])
def test_a_commit_kafka_did_not_confirm_is_asked_again_and_its_moves_committed_once(
    loop: asyncio.AbstractEventLoop, outcome: str
) -> None:
    """Kafka went away after the offsets were sent: the commit may yet happen, so its moves are
    not written again into another transaction (they would be made twice), and no new move
    goes in meanwhile."""
    producer = OutageProducer()
    mover = mover_on(producer, loop)
    done: list[int] = []
    submit(mover, P0, 3, done)
    mover.drain(owned, lambda w: 0)
    producer.down = frozenset({"commit_transaction"})
    assert not mover.commit(offsets(P0), META, owned)
    assert mover.open  # not aborted: librdkafka refuses that while the commit goes on
    assert mover.stranded() == set()
    submit(mover, P1, 5, done)
    assert not mover.drain(owned, lambda w: 0)  # waits for the outcome
    assert not mover.commit(offsets(P0, P1), META, owned)  # still unconfirmed
    producer.down = frozenset()
    producer.aborts_unconfirmed = outcome == "aborted"
    # Ends the commit: offsets(P0, P1) were not in it, so the caller commits them later.
    assert not mover.commit(offsets(P0, P1), META, owned)
    assert len(producer.sent_offsets) == 1
    assert mover.drain(owned, lambda w: 0)
    assert mover.commit(offsets(P0, P1), META, owned)
    if outcome == "committed":
        assert values(producer) == [[b"0@3"], [b"1@5"]]
    else:  # aborted by Kafka: written again, with the move that waited
        assert values(producer) == [[b"0@3", b"1@5"]]
    flush(loop)
    assert done == [3, 5]


def test_the_moves_of_a_partition_given_up_during_an_outage_are_not_written_again(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = OutageProducer()
    mover = mover_on(producer, loop)
    submit(mover, P0, 3, [])
    submit(mover, P1, 5, [])
    mover.drain(owned, lambda w: 0)
    producer.outage()
    assert not mover.commit(offsets(P0, P1), META, owned)
    mover.forget([P0])  # revoked or lost meanwhile: the new owner runs its job again
    assert mover.stranded() == {P1}
    producer.down = frozenset()
    assert mover.drain(owned, lambda w: 0) is False  # nothing new; the old move is written
    assert mover.touched() == [P1]
    assert mover.commit(offsets(P1), META, owned)
    assert values(producer) == [[b"1@5"]]


def test_the_first_move_made_during_an_outage_waits_for_the_registration(
    loop: asyncio.AbstractEventLoop,
) -> None:
    producer = OutageProducer()
    producer.outage()
    mover = mover_on(producer, loop)
    done: list[int] = []
    submit(mover, P0, 3, done)
    assert not mover.drain(owned, lambda w: 0)
    assert producer.waited == [("init_transactions", STEP_TIMEOUT_S)]
    flush(loop)
    assert done == []
    producer.down = frozenset()
    assert mover.drain(owned, lambda w: 0)
    assert mover.commit(offsets(P0), META, owned)
    assert values(producer) == [[b"0@3"]]


# -- the consumer thread through an outage ------------------------------------------------------


class Turns:
    """Turns of a consumer thread's chores, each at a later time, with every asynchronous
    commit answered (the fake consumer's commits succeed: only the producer is cut off)."""

    def __init__(self, thread: ConsumerThread, fake: FakeConsumer, producer: OutageProducer):
        self.thread = thread
        self.fake = fake
        self.producer = producer
        self.now = time.monotonic()
        self.answered = 0

    def turn(self) -> float:
        """One turn of chores; returns how long it waited for the producer at most. A commit
        the turn started on the mover's helper thread is landed before the next turn (as it
        is once it ended, a turn later, by the next drain of the moves)."""
        waited = len(self.producer.waited)
        self.now += 1.0
        self.thread._chores(self.now, idle=True)
        self.thread._committer.land()
        for sent in self.fake.sent[self.answered :]:
            self.thread._committer.on_commit(None, sent)
        self.answered = len(self.fake.sent)
        return sum(timeout for _, timeout in self.producer.waited[waited:])

    def committed(self, partition: int) -> list[int]:
        """Every offset committed for ``partition``, by the consumer or in a transaction."""
        found = [tp.offset for sent in self.fake.sent for tp in sent if tp.partition == partition]
        for positions, _ in self.producer.sent_offsets:
            found += [tp.offset for tp in positions if tp.partition == partition]
        return found


@pytest.fixture
def running(loop: asyncio.AbstractEventLoop) -> tuple[Turns, Mover]:
    producer = OutageProducer()
    mover = mover_on(producer, loop)
    thread, fake, _ = consumer_thread(loop, mover=mover)
    fake.consumer_group_metadata = lambda: None  # type: ignore[attr-defined]
    return Turns(thread, fake, producer), mover


def test_through_an_outage_the_thread_polls_within_seconds_and_commits_nothing_past_a_move(
    loop: asyncio.AbstractEventLoop, running: tuple[Turns, Mover]
) -> None:
    turns, mover = running
    thread, producer = turns.thread, turns.producer
    p0, p1 = own(thread, 0, 1)
    thread._hand(messages(0, 0, 5) + messages(1, 0, 4))
    done: list[int] = []
    p0.commit_offset, p1.commit_offset = 1, 2  # p0@1 fails, p1@2 runs
    submit(mover, P0, 1, done)
    thread._drain_moves()  # in the open transaction
    producer.outage()  # Kafka goes away before it is committed
    longest = max(turns.turn() for _ in range(5))
    assert longest <= 2 * STEP_TIMEOUT_S < HEALTH_LIMIT_S  # each turn ends with a poll
    flush(loop)
    assert done == [1]  # it went into the transaction Kafka did not let us commit
    p0.commit_offset = 5  # the loop counts its job finished, and the others after it
    submit(mover, P1, 2, done)  # p1@2 fails during the outage
    longest = max(turns.turn() for _ in range(5))
    assert longest <= 2 * STEP_TIMEOUT_S
    flush(loop)
    assert done == [1]  # p1@2's move waits, its job unfinished: p1 stays at 2
    assert max(turns.committed(0), default=-1) <= 1  # nothing past p0@1, whose move waits
    assert max(turns.committed(1), default=-1) <= 2
    producer.down = frozenset()
    turns.turn()  # the abort ends; p0@1's move goes in a new transaction with p1@2's
    flush(loop)
    assert done == [1, 2]
    p1.commit_offset = 4
    turns.turn()
    turns.turn()
    assert [[v for _, v in txn] for txn in producer.committed] == [[b"0@1", b"1@2"]]
    assert max(turns.committed(0)) == 5
    assert max(turns.committed(1)) == 4


def test_the_moves_producer_s_requests_time_out_with_its_calls() -> None:
    """librdkafka's send_offsets_to_transaction() waits for its request's own timeout (with a
    transactional id, transaction.timeout.ms - 100: 9.9 s by default), not for the call's."""
    conf = transactional_config(Settings(), "worker", "moves producer", timeout_s=TIMEOUT_S)
    assert conf["socket.timeout.ms"] == 5000
    short = Settings(worker={"transaction_timeout_ms": 1000})
    conf = transactional_config(short, "worker", "moves producer", timeout_s=TIMEOUT_S)
    assert conf["socket.timeout.ms"] == 1100  # librdkafka refuses more
    relay = transactional_config(Settings(), "relay", "retry relay")
    assert "socket.timeout.ms" not in relay  # the relay's calls wait as they did


def test_each_transactional_producer_of_a_worker_has_a_transactional_id_of_its_own() -> None:
    """Even one set for every client in ``kafka``: a producer that fails for good is replaced
    by one that registers its id again, which would fence another process sharing it."""
    shared = Settings(namespace="ns", kafka={"transactional.id": "shared"})
    ids = {
        transactional_config(shared, role, "test")["transactional.id"]
        for role in ("worker", "worker", "relay")
    }
    assert len(ids) == 3
    assert all(i.startswith(("ns.worker.", "ns.relay.")) for i in ids)


def test_commits_aborted_again_and_again_are_an_error(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    """A record Kafka refuses every time (a topic written that is missing, or not allowed)
    aborts every commit of the moves, and with them every commit of the offsets: said at INFO,
    as a rebalance's abort is, nobody knew."""
    producer = FakeProducer()
    mover = mover_on(producer, loop)  # type: ignore[arg-type]
    submit(mover, P0, 3, [])
    mover.drain(owned, lambda w: 0)
    producer.fail["commit_transaction"] = deque(abortable() for _ in range(ABORTS_TOLD))
    with caplog.at_level(logging.INFO, logger="pipeline.worker"):
        for _ in range(ABORTS_TOLD - 1):
            assert not mover.commit(offsets(P0), META, owned)
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not mover.commit(offsets(P0), META, owned)
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"not committed {ABORTS_TOLD} times in a row" in error.getMessage()
