"""A transactional producer that fails for good is replaced when its owner says how (``renew``):
the worker's, whose transactional id no other process uses.

The fake producer of :mod:`tests.unit.test_transactions` raises librdkafka's fatal errors at
one step; what must follow is a new producer, registered before its first transaction, and an
abort that says to write the transaction again, never a fenced error.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from pipeline._errors import (
    KafkaUnavailableError,
    NotAuthorizedError,
    TransactionAbortedError,
    TransactionFencedError,
    TransactionProducerFailedError,
)
from pipeline._transactions import Transactions

from .test_transactions import OFFSETS, STEPS, FakeProducer, fatal, fenced, retriable, write_two


def produce_after_failing() -> KafkaException:
    """What ``produce()`` raises once the producer failed for good (seen on Kafka 4.4 with
    librdkafka 2.16, after a newer producer of its id fenced it): the bare code, not flagged
    fatal as the transactional calls' errors are."""
    return KafkaException(
        KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error")
    )


def invalid_state() -> KafkaException:
    """What a broker crash left behind (seen on Kafka 4.1 with transactions version 2)."""
    return KafkaException(
        KafkaError(
            KafkaError.INVALID_TXN_STATE,
            "Failed to end transaction: Broker: Producer attempted a transactional operation in "
            "an invalid state",
            fatal=True,
        )
    )


class Renewing:
    """A :class:`Transactions` with ``renew``, and every producer it was given, in order."""

    def __init__(self, first: FakeProducer, *later: FakeProducer, attempts: int = 5) -> None:
        self.producers = [first]
        self._later = list(later)
        self.txn = Transactions(
            first,
            name="the test's transactional producer",
            sleep=lambda _: None,
            attempts=attempts,
            renew=self.new,
        )

    def new(self) -> FakeProducer:
        producer = self._later.pop(0) if self._later else FakeProducer()
        self.producers.append(producer)
        return producer


@pytest.mark.parametrize("step", [*STEPS, "abort_transaction"])
@pytest.mark.parametrize("error", [invalid_state, fenced], ids=["invalid-state", "fenced"])
def test_a_fatal_error_puts_a_new_producer_in_place_and_the_unit_runs_again(
    step: str, error: type[KafkaException]
) -> None:
    first = FakeProducer().failing(step, error())
    if step == "abort_transaction":  # the abort of a unit Kafka wanted aborted
        first.failing(
            "commit_transaction",
            KafkaException(
                KafkaError(KafkaError.ILLEGAL_GENERATION, "rebalanced", txn_requires_abort=True)
            ),
        )
    renewing = Renewing(first)
    txn = renewing.txn
    txn.init()
    txn.run(write_two, OFFSETS, "group-metadata")
    assert txn.renewals == 1
    old, new = renewing.producers
    assert old.committed == []
    assert new.calls[:2] == ["init_transactions", "begin_transaction"]
    assert new.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]
    assert new.sent_offsets == [(OFFSETS, "group-metadata")]


def test_the_open_transaction_of_a_failed_producer_is_aborted_for_the_caller_to_write_again() -> (
    None
):
    renewing = Renewing(FakeProducer().failing("commit_transaction", invalid_state()))
    txn = renewing.txn
    txn.init()
    txn.produce("ns.dlq", b"moved")
    with pytest.raises(TransactionAbortedError, match=r"failed for good .*invalid state"):
        txn.commit(OFFSETS, "group-metadata")
    assert not txn.open
    txn.rewrite(lambda t: t.produce("ns.dlq", b"moved"))
    txn.commit(OFFSETS, "group-metadata")
    assert renewing.producers[1].committed == [[("ns.dlq", b"moved")]]


def test_an_unconfirmed_abort_that_ends_in_a_fatal_error_renews_before_the_next_begin() -> None:
    """The broker restarted under an abort: finishing it, Kafka answers INVALID_TXN_STATE."""
    renewing = Renewing(
        FakeProducer().failing("abort_transaction", retriable(), invalid_state()), attempts=1
    )
    txn = renewing.txn
    txn.init()
    txn.produce("ns.dlq", b"moved")
    txn.abort()
    assert txn.aborting
    with pytest.raises(TransactionAbortedError, match="finish aborting"):
        txn.begin()
    txn.run(write_two)
    [_, new] = renewing.producers
    assert new.calls[:2] == ["init_transactions", "begin_transaction"]
    assert new.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]


def test_a_new_producer_registers_once_kafka_answers() -> None:
    new = FakeProducer().failing("init_transactions", retriable(), retriable())
    renewing = Renewing(
        FakeProducer().failing("commit_transaction", invalid_state()), new, attempts=1
    )
    txn = renewing.txn
    txn.init()
    txn.produce("ns.dlq", b"moved")
    with pytest.raises(TransactionAbortedError):
        txn.commit()
    for _ in range(2):
        with pytest.raises(KafkaUnavailableError, match="register the transactional id"):
            txn.begin()
        assert not txn.open
    txn.produce("ns.dlq", b"moved")
    txn.commit()
    assert new.calls.count("init_transactions") == 3
    assert new.committed == [[("ns.dlq", b"moved")]]
    assert txn.renewals == 1


def test_a_new_producer_kafka_refuses_to_register_stops_the_caller() -> None:
    """Renewing again would not cure it: the cluster cannot take this producer."""
    new = FakeProducer().failing("init_transactions", fatal())
    renewing = Renewing(FakeProducer().failing("commit_transaction", invalid_state()), new)
    txn = renewing.txn
    txn.init()
    with pytest.raises(TransactionFencedError, match="transactions not supported"):
        txn.run(write_two)
    assert txn.renewals == 1


def test_a_fatal_error_before_the_first_registration_is_not_renewed() -> None:
    renewing = Renewing(FakeProducer().failing("init_transactions", fatal()))
    with pytest.raises(TransactionFencedError, match="transactions not supported"):
        renewing.txn.init()
    assert len(renewing.producers) == 1


def test_without_renew_a_fatal_error_that_is_no_fence_is_a_transaction_not_committed() -> None:
    """For an owner that makes a new producer itself (the scheduler's next term), not retried
    with the failed one."""
    producer = FakeProducer().failing("commit_transaction", invalid_state())
    txn = Transactions(producer, name="the test's transactional producer", sleep=lambda _: None)
    txn.init()
    with pytest.raises(TransactionProducerFailedError, match="a new producer must write it"):
        txn.run(write_two)
    assert producer.calls.count("commit_transaction") == 1
    assert not txn.open


def test_a_produce_refused_by_a_producer_that_failed_for_good_renews_it() -> None:
    renewing = Renewing(FakeProducer().failing("produce", produce_after_failing()))
    txn = renewing.txn
    txn.init()
    txn.run(write_two, OFFSETS, "group-metadata")
    assert txn.renewals == 1
    old, new = renewing.producers
    assert "abort_transaction" not in old.calls  # nothing can be aborted: the broker does it
    assert new.committed == [[("ns.jobs.default", b"a"), ("ns.jobs.default", b"b")]]


def test_without_renew_a_produce_refused_for_good_asks_for_a_new_producer() -> None:
    producer = FakeProducer().failing("produce", produce_after_failing())
    txn = Transactions(producer, name="the test's transactional producer", sleep=lambda _: None)
    txn.init()
    with pytest.raises(TransactionProducerFailedError, match="Fatal error"):
        txn.run(write_two)
    assert producer.calls.count("produce") == 1
    assert "abort_transaction" not in producer.calls
    assert not txn.open


def test_without_renew_a_fenced_producer_still_stops_the_caller() -> None:
    producer = FakeProducer().failing("commit_transaction", fenced())
    txn = Transactions(producer, name="the test's transactional producer", sleep=lambda _: None)
    txn.init()
    with pytest.raises(TransactionFencedError, match="was fenced"):
        txn.run(write_two)


class Hanging(FakeProducer):
    """``send_offsets_to_transaction`` blocks, whatever its timeout, until :attr:`release` is
    set: librdkafka's call after a broker restart (confluentinc/librdkafka#5456)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float = -1, /
    ) -> None:
        self.calls.append("send_offsets_to_transaction")
        self.release.wait()


@pytest.mark.parametrize("renews", [True, False], ids=["renewed", "owner-told"])
def test_a_send_of_offsets_that_never_returns_is_given_up_on_at_twice_its_timeout(
    renews: bool,
) -> None:
    """The worker's commit thread sat in it for good after a broker restart: no job ran
    again until the worker was restarted."""
    stuck = Hanging()
    later: list[FakeProducer] = []

    def new() -> FakeProducer:
        later.append(FakeProducer())
        return later[-1]

    txn = Transactions(
        stuck,
        name="the test's transactional producer",
        sleep=lambda _: None,
        timeout_s=0.05,
        renew=new if renews else None,
    )
    try:
        txn.init()
        txn.produce("ns.dlq", b"moved")
        raised: list[BaseException] = []

        def commit() -> None:
            try:
                txn.commit(OFFSETS, "group-metadata")
            except BaseException as exc:
                raised.append(exc)

        committing = threading.Thread(target=commit, daemon=True)
        committing.start()
        committing.join(10)  # bounded: without the deadline the commit never returns
        assert not committing.is_alive(), "the commit still waits for the stuck call"
        [error] = raised
        assert type(error) is (
            TransactionAbortedError if renews else TransactionProducerFailedError
        )
        assert "did not return in 0.1s, twice its timeout" in str(error)
        assert not txn.open
        assert "commit_transaction" not in stuck.calls
        if renews:
            txn.rewrite(lambda t: t.produce("ns.dlq", b"moved"))
            txn.commit(OFFSETS, "group-metadata")
            [new_producer] = later
            assert new_producer.calls[:2] == ["init_transactions", "begin_transaction"]
            assert new_producer.committed == [[("ns.dlq", b"moved")]]
            assert new_producer.sent_offsets == [(OFFSETS, "group-metadata")]
    finally:
        stuck.release.set()
        txn.close(0.1)


@pytest.mark.parametrize("step", ["init_transactions", "send_offsets_to_transaction"])
@pytest.mark.parametrize("renews", [True, False], ids=["renewed", "not-renewed"])
def test_a_transactional_id_the_acls_refuse_is_named_not_renewed_nor_fenced(
    step: str, renews: bool
) -> None:
    """The worker said "failed for good ... restart the process" (a restart fails again, and
    `--processes` restarted it every 30 s, running its jobs again); the scheduler said it was
    fenced by another scheduler."""
    refused = KafkaException(
        KafkaError(
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            "Transactional Id authorization failed",
            fatal=True,
        )
    )
    made: list[FakeProducer] = []

    def new() -> FakeProducer:
        made.append(FakeProducer())
        return made[-1]

    txn = Transactions(
        FakeProducer().failing(step, refused),
        name="the test's transactional producer",
        sleep=lambda _: None,
        renew=new if renews else None,
        acl=("acme.worker.host-1", "alice", "worker"),
    )

    def register_and_run() -> None:
        txn.init()
        txn.run(write_two, OFFSETS, "group-metadata")

    with pytest.raises(NotAuthorizedError) as raised:
        register_and_run()
    assert "Kafka user alice lacks WRITE on TRANSACTIONAL_ID acme.worker.host-1" in str(
        raised.value
    )
    assert "--role worker --principal User:alice" in str(raised.value)
    assert made == []
    assert not txn.open
