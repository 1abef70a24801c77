"""The transaction loop's error handling, against librdkafka's own error classes.

A fake producer raises ``KafkaException(KafkaError(...))`` with the flags librdkafka sets
(``retriable``, ``txn_requires_abort``, ``fatal``) at one step: begin, produce, send the
offsets or commit. Each kind must lead to the documented behaviour at each step.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline._errors import (
    KafkaUnavailableError,
    TransactionAbortedError,
    TransactionError,
    TransactionFencedError,
)
from pipeline._transactions import Headers, Message, Transactions

STEPS = ("begin_transaction", "produce", "send_offsets_to_transaction", "commit_transaction")
OFFSETS = [TopicPartition("ns.retry.0", 0, 42)]


def retriable() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "coordinator loading", retriable=True)
    )


def abortable() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError.ILLEGAL_GENERATION, "the group rebalanced", txn_requires_abort=True)
    )


def fenced() -> KafkaException:
    return KafkaException(
        KafkaError(KafkaError._FENCED, "Producer fenced by newer instance", fatal=True)
    )


def fatal() -> KafkaException:
    """A fatal error that is neither a fence nor a refusal of the ACLs (those have their own
    errors): what librdkafka raises for a broker that does not support transactions."""
    return KafkaException(
        KafkaError(KafkaError.UNSUPPORTED_VERSION, "transactions not supported", fatal=True)
    )


def refused() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._STATE, "Operation not valid in state Ready"))


def invalid() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, "Invalid partition"))


def produce_in_abortable_state() -> KafkaException:
    """What ``produce()`` raises once a message of the open transaction failed (seen on Kafka
    4.4 with librdkafka 2.16: a message the broker refused as too large): the bare code,
    without the ``txn_requires_abort`` flag the commit's error then carries."""
    return KafkaException(
        KafkaError(KafkaError._STATE, "Unable to produce message: Local: Erroneous state")
    )


class FakeProducer:
    """Records the calls; ``fail[step]`` holds what that step raises, one per call. With
    ``max_bytes``, a message larger than that is refused before it is taken, as librdkafka
    refuses one above its ``message.max.bytes``."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.calls: list[str] = []
        self.fail: dict[str, deque[BaseException]] = {}
        self.written: list[tuple[str, bytes | None]] = []
        self.committed: list[list[tuple[str, bytes | None]]] = []
        self.sent_offsets: list[tuple[list[TopicPartition], Any]] = []
        self._txn: list[tuple[str, bytes | None]] = []
        self.produced: list[tuple[str, bytes | None, bytes | None, int, Headers]] = []
        """Every message produce() took, with its key, partition and headers."""

    def failing(self, step: str, *errors: BaseException) -> FakeProducer:
        self.fail.setdefault(step, deque()).extend(errors)
        return self

    def _call(self, step: str) -> None:
        self.calls.append(step)
        pending = self.fail.get(step)
        if pending:
            raise pending.popleft()

    def init_transactions(self, timeout: float = -1, /) -> None:
        self._call("init_transactions")

    def begin_transaction(self) -> None:
        self._call("begin_transaction")
        self._txn = []

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        *,
        headers: Headers = None,
    ) -> None:
        self._call("produce")
        if self.max_bytes is not None and len(value or b"") + len(key or b"") > self.max_bytes:
            raise KafkaException(
                KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
            )
        self._txn.append((topic, value))
        self.produced.append((topic, value, key, partition, headers))

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1, /
    ) -> None:
        self._call("send_offsets_to_transaction")
        self.sent_offsets.append((positions, group_metadata))

    def commit_transaction(self, timeout: float = -1, /) -> None:
        self._call("commit_transaction")
        self.committed.append(self._txn)
        self._txn = []

    def abort_transaction(self, timeout: float = -1, /) -> None:
        self._call("abort_transaction")
        self._txn = []

    def poll(self, timeout: float = -1, /) -> int:
        return 0

    def flush(self, timeout: float = -1, /) -> int:
        self._call("flush")
        return 0


def transactions(producer: FakeProducer) -> tuple[Transactions, list[float]]:
    pauses: list[float] = []
    txn = Transactions(
        producer,
        name="the test's transactional producer",
        when_fenced="another test took over; run it again",
        sleep=pauses.append,
    )
    return txn, pauses


def write_two(txn: Transactions) -> None:
    txn.produce("ns.jobs.default", b"a", b"k")
    txn.produce("ns.jobs.default", b"b", b"k", headers=[("h", b"1")], partition=3)


def test_a_unit_commits_its_messages_with_the_offsets() -> None:
    producer = FakeProducer()
    txn, pauses = transactions(producer)
    txn.init()
    txn.run(write_two, OFFSETS, "group-metadata")
    assert producer.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]
    assert producer.sent_offsets == [(OFFSETS, "group-metadata")]
    assert producer.calls == [
        "init_transactions",
        "begin_transaction",
        "produce",
        "produce",
        "send_offsets_to_transaction",
        "commit_transaction",
    ]
    assert not txn.open
    assert pauses == []


@pytest.mark.parametrize("step", STEPS)
def test_a_retriable_error_retries_the_step_only(step: str) -> None:
    producer = FakeProducer().failing(step, retriable(), retriable())
    txn, pauses = transactions(producer)
    txn.run(write_two, OFFSETS, "group-metadata")
    assert producer.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]
    assert producer.calls.count(step) == (4 if step == "produce" else 3)
    assert "abort_transaction" not in producer.calls
    assert pauses == [0.1, 0.2]  # a growing pause between attempts


@pytest.mark.parametrize("step", STEPS)
def test_retries_are_bounded_then_the_transaction_is_aborted(step: str) -> None:
    producer = FakeProducer().failing(step, *(retriable() for _ in range(5)))
    txn, pauses = transactions(producer)
    with pytest.raises(KafkaUnavailableError, match="in 5 attempts") as caught:
        txn.run(write_two, OFFSETS, "group-metadata")
    assert "the test's transactional producer" in str(caught.value)
    assert isinstance(caught.value.__cause__, KafkaException)
    assert producer.committed == []
    assert len(pauses) == 4
    assert producer.calls.count("abort_transaction") == (0 if step == "begin_transaction" else 1)
    assert not txn.open


@pytest.mark.parametrize("step", STEPS[1:])
def test_an_abortable_error_aborts_and_runs_the_whole_unit_again(step: str) -> None:
    producer = FakeProducer().failing(step, abortable())
    txn, _ = transactions(producer)
    txn.run(write_two, OFFSETS, "group-metadata")
    assert producer.calls.count("abort_transaction") == 1
    assert producer.calls.count("begin_transaction") == 2
    # Only the second transaction committed, and it holds the whole unit.
    assert producer.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]


def test_units_aborted_again_and_again_end_in_a_clear_error() -> None:
    producer = FakeProducer().failing("commit_transaction", *(abortable() for _ in range(3)))
    txn, _ = transactions(producer)
    with pytest.raises(TransactionAbortedError, match="aborted 3 transactions in a row"):
        txn.run(write_two, OFFSETS, "group-metadata")
    assert producer.calls.count("abort_transaction") == 3
    assert producer.committed == []
    assert not txn.open


@pytest.mark.parametrize("step", STEPS[1:])
def test_an_open_transaction_is_aborted_and_said_so(step: str) -> None:
    """Fed over time (the scheduler, the relay): the caller rewinds on the abort."""
    producer = FakeProducer().failing(step, abortable())
    txn, _ = transactions(producer)

    def feed_and_commit() -> None:
        write_two(txn)
        txn.commit(OFFSETS, "group-metadata")

    with pytest.raises(TransactionAbortedError, match="the group rebalanced"):
        feed_and_commit()
    assert producer.calls[-1] == "abort_transaction"
    assert not txn.open
    write_two(txn)  # the next write opens a new transaction
    txn.commit(OFFSETS, "group-metadata")
    assert producer.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]


def test_rewrite_puts_what_is_still_held_into_a_new_open_transaction() -> None:
    """The worker's moves: a commit aborted by a rebalance, the moves written again."""
    producer = FakeProducer().failing("commit_transaction", abortable())
    txn, _ = transactions(producer)
    write_two(txn)
    with pytest.raises(TransactionAbortedError):
        txn.commit(OFFSETS, "group-metadata")
    txn.rewrite(lambda t: t.produce("ns.jobs.default", b"b", b"k"))
    assert txn.open
    assert producer.committed == []
    txn.commit(OFFSETS, "group-metadata")
    assert producer.committed == [[("ns.jobs.default", b"b")]]


@pytest.mark.parametrize("step", ["init_transactions", *STEPS])
def test_a_fenced_producer_raises_one_error_and_aborts_nothing(step: str) -> None:
    producer = FakeProducer().failing(step, fenced())
    txn, _ = transactions(producer)

    def init_and_run() -> None:
        txn.init()
        txn.run(write_two, OFFSETS, "group-metadata")

    with pytest.raises(TransactionFencedError, match="another test took over") as caught:
        init_and_run()
    assert caught.value.reason == "Producer fenced by newer instance"
    assert "abort_transaction" not in producer.calls  # the broker aborts it
    assert not txn.open
    txn.close()  # nothing to abort, still delivers what is queued
    assert producer.calls[-1] == "flush"


def test_any_fatal_error_is_the_same_error_naming_its_cause() -> None:
    producer = FakeProducer().failing("commit_transaction", fatal())
    txn, _ = transactions(producer)
    with pytest.raises(TransactionFencedError, match=r"failed for good .*not supported"):
        txn.run(write_two)
    assert producer.calls.count("commit_transaction") == 1


def test_an_error_kafka_does_not_flag_is_not_retried() -> None:
    producer = FakeProducer().failing("produce", invalid())
    txn, pauses = transactions(producer)
    with pytest.raises(TransactionError, match="Invalid partition") as caught:
        txn.run(write_two)
    assert not isinstance(caught.value, TransactionAbortedError)
    assert producer.calls == ["begin_transaction", "produce", "abort_transaction"]
    assert pauses == []


def test_a_produce_refused_because_the_transaction_must_be_aborted_writes_the_unit_again() -> None:
    # The first message failed on its way (the producer knows it by the second produce()).
    producer = FakeProducer().failing("produce", produce_in_abortable_state())
    txn, pauses = transactions(producer)
    txn.run(write_two, OFFSETS, "group-metadata")
    assert producer.calls[:3] == ["begin_transaction", "produce", "abort_transaction"]
    assert producer.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]
    assert pauses == []
    # Written on its own, the refusal is an abort: nothing of it is visible, write it again.
    producer.failing("produce", produce_in_abortable_state())
    with pytest.raises(TransactionAbortedError, match="Erroneous state"):
        txn.produce("ns.jobs.default", b"c")
    assert producer.calls[-1] == "abort_transaction"
    assert not txn.open


def test_a_full_local_queue_waits_for_room() -> None:
    producer = FakeProducer().failing("produce", BufferError(), BufferError())
    txn, _ = transactions(producer)
    txn.run(write_two)
    assert producer.calls.count("produce") == 4
    assert len(producer.committed[0]) == 2


MESSAGES: list[Message] = [
    ("ns.dedup", b"a", b"k1", None, None),
    ("ns.dedup", None, b"k2", [("h", b"1")], 3),
]


def test_produce_all_opens_one_transaction_for_every_message() -> None:
    producer = FakeProducer()
    txn, _ = transactions(producer)
    txn.produce_all(MESSAGES)
    txn.commit(OFFSETS, "group-metadata")
    assert producer.calls[:3] == ["begin_transaction", "produce", "produce"]
    # No partition: the partitioner's (-1); a partition and headers are passed on.
    assert producer.produced == [
        ("ns.dedup", b"a", b"k1", -1, None),
        ("ns.dedup", None, b"k2", 3, [("h", b"1")]),
    ]
    assert producer.committed == [[("ns.dedup", b"a"), ("ns.dedup", None)]]


def test_a_message_produce_all_cannot_write_at_once_goes_through_the_retries() -> None:
    # The first message: the local queue is full, then Kafka does not answer, then it is
    # written; the second goes on as usual. Nothing is lost or written twice.
    producer = FakeProducer().failing("produce", BufferError(), retriable())
    txn, pauses = transactions(producer)
    txn.produce_all(MESSAGES)
    txn.commit(OFFSETS, "group-metadata")
    assert producer.calls.count("produce") == 4
    assert producer.calls.count("begin_transaction") == 1
    assert pauses == [0.1]
    assert producer.committed == [[("ns.dedup", b"a"), ("ns.dedup", None)]]


def test_a_failing_abort_is_retried_then_left_to_the_broker(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = FakeProducer().failing("abort_transaction", retriable(), refused())
    txn, _ = transactions(producer)
    txn.begin()
    txn.abort()
    assert producer.calls.count("abort_transaction") == 2
    assert not txn.open
    assert "aborting a transaction failed" in caplog.text
    txn.abort()  # nothing open: nothing to do
    assert producer.calls.count("abort_transaction") == 2


def test_commit_without_an_open_transaction_does_nothing() -> None:
    producer = FakeProducer()
    txn, _ = transactions(producer)
    txn.commit(OFFSETS, "group-metadata")
    assert producer.calls == []


def test_closing_a_fenced_producer_does_not_raise_again() -> None:
    producer = FakeProducer().failing("commit_transaction", fenced()).failing("flush", fenced())
    txn, _ = transactions(producer)
    with pytest.raises(TransactionFencedError):
        txn.run(write_two)
    txn.close()
    assert producer.calls[-1] == "flush"


def test_init_until_waits_out_an_outage_then_registers() -> None:
    producer = FakeProducer().failing("init_transactions", *(retriable() for _ in range(12)))
    txn, pauses = transactions(producer)
    assert txn.init_until(lambda: False)
    # more tries than the bounded loop allows, none of them paused by it: the timeout paces them
    assert producer.calls == ["init_transactions"] * 13
    assert pauses == []


def test_init_until_gives_up_when_stopped() -> None:
    producer = FakeProducer().failing("init_transactions", *(retriable() for _ in range(100)))
    txn, _ = transactions(producer)
    tries = iter(range(3))
    assert not txn.init_until(lambda: next(tries, None) is None)
    assert producer.calls == ["init_transactions"] * 3


def test_init_until_raises_on_an_error_waiting_cannot_cure() -> None:
    producer = FakeProducer().failing("init_transactions", retriable(), fenced())
    txn, _ = transactions(producer)
    with pytest.raises(TransactionFencedError, match="another test took over"):
        txn.init_until(lambda: False)
    assert producer.calls == ["init_transactions"] * 2


OUTAGE = frozenset({"init_transactions", "send_offsets_to_transaction", "commit_transaction"})
"""The calls that wait for Kafka (with ``abort_transaction``, which a commit in progress
refuses first): the producer's side of a broker outage."""


class OutageProducer(FakeProducer):
    """librdkafka's transactional producer while the calls in ``down`` get no answer: such a
    call waits out its timeout (recorded in ``waited``) and fails retriably. As librdkafka does,
    a commit or an abort that timed out goes on in the background, and every other
    transactional call is refused (``_CONFLICT``, retriable) until that one is called again
    and ends (``produce`` too, while a commit goes on); when Kafka answers again, a commit that
    went on ends committed, or aborted if ``aborts_unconfirmed``."""

    def __init__(self) -> None:
        super().__init__()
        self.down: frozenset[str] = frozenset()
        self.waited: list[tuple[str, float]] = []
        self.in_progress: str | None = None
        self.aborts_unconfirmed = False

    def outage(self) -> None:
        self.down = OUTAGE | {"abort_transaction"}

    def _api(self, name: str, timeout: float | None, *, resumable: bool) -> None:
        """Refuse a call that conflicts with one in progress; time out one that gets no answer."""
        if self.in_progress is not None and self.in_progress != name:
            self.calls.append(f"{name} refused")
            raise KafkaException(
                KafkaError(
                    KafkaError._CONFLICT,
                    f"Conflicting {self.in_progress} API call is already in progress",
                    retriable=True,
                )
            )
        if name in self.down:
            assert timeout is not None, f"{name} without a timeout"
            assert timeout >= 0, f"{name} without a timeout"
            self.calls.append(f"{name} timed out")
            self.waited.append((name, timeout))
            if resumable:
                self.in_progress = name
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "Timed out, retry call to resume", retriable=True)
            )

    def init_transactions(self, timeout: float = -1, /) -> None:
        self._api("init_transactions", timeout, resumable=True)
        self.in_progress = None
        super().init_transactions(timeout)

    def begin_transaction(self) -> None:
        self._api("begin_transaction", None, resumable=False)
        super().begin_transaction()

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        *,
        headers: Headers = None,
    ) -> None:
        if self.in_progress == "commit_transaction":
            raise KafkaException(KafkaError(KafkaError._STATE, "Operation not valid in state"))
        super().produce(topic, value, key, partition, headers=headers)

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1, /
    ) -> None:
        self._api("send_offsets_to_transaction", timeout, resumable=False)
        super().send_offsets_to_transaction(positions, group_metadata, timeout)

    def commit_transaction(self, timeout: float = -1, /) -> None:
        self._api("commit_transaction", timeout, resumable=True)
        resumed, self.in_progress = self.in_progress, None
        if resumed and self.aborts_unconfirmed:
            self._txn = []
            raise abortable()
        super().commit_transaction(timeout)

    def abort_transaction(self, timeout: float = -1, /) -> None:
        self._api("abort_transaction", timeout, resumable=True)
        self.in_progress = None
        super().abort_transaction(timeout)


def test_an_abort_kafka_does_not_confirm_is_finished_before_the_next_transaction_begins() -> None:
    """librdkafka refuses begin_transaction() while an abort it went on with is not called
    again: the next begin finishes it, and raises while Kafka still does not answer."""
    producer = OutageProducer()
    txn, _ = transactions(producer)
    txn.produce("ns.jobs.default", b"a")
    producer.outage()
    with pytest.raises(KafkaUnavailableError, match="nothing of the open transaction"):
        txn.commit(OFFSETS, "group-metadata")  # the offsets time out, then the abort does
    assert (txn.open, txn.aborting, txn.committing) == (False, True, False)
    with pytest.raises(KafkaUnavailableError, match="finish aborting"):
        txn.produce("ns.jobs.default", b"b")
    assert not txn.open
    assert "begin_transaction refused" not in producer.calls
    producer.down = frozenset()
    txn.produce("ns.jobs.default", b"b")
    txn.commit(OFFSETS, "group-metadata")
    assert producer.committed == [[("ns.jobs.default", b"b")]]
    assert not txn.aborting


@pytest.mark.parametrize("outcome", ["committed", "aborted"])
def test_a_commit_kafka_does_not_confirm_is_asked_again_not_called_lost(outcome: str) -> None:
    """A commit whose call timed out may yet be committed: it is not reported as aborted (its
    abort is refused meanwhile), and the next commit learns the outcome, sending no offsets."""
    producer = OutageProducer()
    txn, _ = transactions(producer)
    txn.produce("ns.jobs.default", b"a")
    producer.down = frozenset({"commit_transaction"})  # the offsets went, then Kafka went away
    with pytest.raises(KafkaUnavailableError, match="may yet be committed"):
        txn.commit(OFFSETS, "group-metadata")
    assert (txn.open, txn.committing) == (True, True)
    assert "abort_transaction refused" in producer.calls
    with pytest.raises(KafkaUnavailableError, match="may yet be committed"):
        txn.commit([TopicPartition("ns.retry.0", 0, 50)], "group-metadata")  # still down
    producer.down = frozenset()
    producer.aborts_unconfirmed = outcome == "aborted"
    if outcome == "committed":
        txn.commit([TopicPartition("ns.retry.0", 0, 50)], "group-metadata")
        assert producer.committed == [[("ns.jobs.default", b"a")]]
    else:
        with pytest.raises(TransactionAbortedError):
            txn.commit([TopicPartition("ns.retry.0", 0, 50)], "group-metadata")
        assert producer.committed == []
    assert producer.sent_offsets == [(OFFSETS, "group-metadata")]  # sent once, never again
    assert (txn.open, txn.committing) == (False, False)


def test_a_transaction_begun_after_an_unconfirmed_commit_ends_that_commit_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer = OutageProducer()
    txn, _ = transactions(producer)
    txn.produce("ns.jobs.default", b"a")
    producer.down = frozenset({"commit_transaction"})
    with pytest.raises(KafkaUnavailableError):
        txn.commit()
    producer.down = frozenset()
    txn.run(lambda t: t.produce("ns.jobs.default", b"b"))
    assert producer.committed == [[("ns.jobs.default", b"a")], [("ns.jobs.default", b"b")]]
    assert "unconfirmed commit was committed after all" in caplog.text
    assert not any(call.endswith("refused") for call in producer.calls[-4:])
