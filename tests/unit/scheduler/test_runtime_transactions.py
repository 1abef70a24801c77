"""What the scheduler does with each kind of transaction error, without a broker.

The leadership and the leader's session are replaced by fakes; the session's step raises the
error the library's transaction loop raises for each kind of librdkafka error.
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import pipeline_scheduler._runtime as runtime
import pipeline_scheduler._txn as txn_module
from pipeline._errors import (
    KafkaUnavailableError,
    NotAuthorizedError,
    TransactionAbortedError,
    TransactionFencedError,
    TransactionProducerFailedError,
)
from pipeline._settings import Settings
from pipeline._transactions import Transactions
from pipeline_scheduler._runtime import EXIT_FENCED, EXIT_REFUSED, Scheduler
from pipeline_scheduler._txn import leader_transactions


class FakeLeadership:
    def __init__(self, settings: Settings) -> None:
        self.is_leader = True

    def poll(self, timeout: float) -> None:
        pass

    def close(self) -> None:
        pass


def run_with(monkeypatch: pytest.MonkeyPatch, error: Exception | None) -> tuple[int, list[str]]:
    """Run a scheduler whose first session's first step raises ``error`` (None: the step goes
    well, and then its topics have gained partitions); the second session's first step stops
    the scheduler. Returns the exit code and what the sessions saw."""
    seen: list[str] = []
    scheduler = Scheduler(Settings(bootstrap_servers="localhost:1"))

    class FakeSession:
        count = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            FakeSession.count += 1
            self.number = FakeSession.count
            self.held = self.parked = 0

        def start(self) -> None:
            seen.append(f"start {self.number}")

        def step(self) -> None:
            if self.number == 1 and error is not None:
                raise error
            seen.append(f"step {self.number}")
            if self.number > 1:
                scheduler.stop()

        def partitions_changed(self) -> bool:
            return self.number == 1

        def close(self) -> None:
            seen.append(f"close {self.number}")

    monkeypatch.setattr(runtime, "Leadership", FakeLeadership)
    monkeypatch.setattr(runtime, "LeaderSession", FakeSession)
    return scheduler.run(), seen


@pytest.mark.parametrize(
    "error",
    [
        TransactionAbortedError("Kafka aborted the transaction: the group rebalanced"),
        KafkaUnavailableError("Kafka did not let the producer commit a transaction in 5 attempts"),
        TransactionProducerFailedError("failed for good (INVALID_TXN_STATE)"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_a_transaction_not_committed_rewinds_to_a_new_term(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    code, seen = run_with(monkeypatch, error)
    assert code == 0
    assert seen == ["start 1", "close 1", "start 2", "step 2", "close 2"]


def test_topics_that_gained_partitions_end_the_term_and_a_new_one_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, seen = run_with(monkeypatch, None)
    assert code == 0
    assert seen == ["start 1", "step 1", "close 1", "start 2", "step 2", "close 2"]


def test_a_fenced_producer_stops_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    code, seen = run_with(monkeypatch, TransactionFencedError("fenced", "fenced by newer"))
    assert code == EXIT_FENCED
    assert seen == ["start 1", "close 1"]


class TimingOutProducer:
    """A transactional producer while Kafka is down: every call waits out its timeout."""

    def __init__(self) -> None:
        self.waited: list[tuple[str, float]] = []

    def _timed_out(self, call: str, timeout: float) -> None:
        self.waited.append((call, timeout))
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))

    def init_transactions(self, timeout: float = -1, /) -> None:
        self._timed_out("init", timeout)

    def begin_transaction(self) -> None:
        pass

    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def commit_transaction(self, timeout: float = -1, /) -> None:
        self._timed_out("commit", timeout)

    def abort_transaction(self, timeout: float = -1, /) -> None:
        self._timed_out("abort", timeout)

    def send_offsets_to_transaction(
        self, positions: list[Any], group_metadata: Any, timeout: float = -1, /
    ) -> None:
        self._timed_out("offsets", timeout)

    def poll(self, timeout: float = -1, /) -> int:
        return 0

    def flush(self, timeout: float = -1, /) -> int:
        return 0


def outage(txn: Transactions) -> TimingOutProducer:
    """Run a commit, then the next term's registration, while Kafka is down."""
    producer = TimingOutProducer()
    txn.producer = producer
    txn.produce("t", b"v")
    with pytest.raises(KafkaUnavailableError):
        txn.commit()
    with pytest.raises(KafkaUnavailableError):
        txn.init()
    assert {call for call, _ in producer.waited} == {"commit", "abort", "init"}
    return producer


def test_an_outage_blocks_the_leader_seconds_not_minutes() -> None:
    """Kafka down mid-term: the commit, its abort and the next term's registration each wait
    a bounded time (they were 5 x 30 s each: minutes without serving the leadership group)."""
    txn = leader_transactions(Settings(bootstrap_servers="localhost:1"))
    txn._sleep = lambda seconds: None  # the pauses between attempts are counted below
    producer = outage(txn)
    assert max(timeout for _, timeout in producer.waited) <= 5, producer.waited
    assert sum(timeout for _, timeout in producer.waited) <= 75, producer.waited


def test_between_attempts_the_leader_serves_its_leadership_group() -> None:
    served: list[float] = []
    txn = leader_transactions(Settings(bootstrap_servers="localhost:1"), serve=served.append)
    producer = outage(txn)
    # Every retry waited in the leadership group's poll (a revocation is seen there).
    assert len(served) == len(producer.waited) - 3
    assert sum(served) < 5


def test_the_leader_session_is_given_the_leadership_poll_to_wait_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    polled: list[float] = []

    class Polled(FakeLeadership):
        def poll(self, timeout: float) -> None:
            polled.append(timeout)

    scheduler = Scheduler(Settings(bootstrap_servers="localhost:1"))
    given: dict[str, Any] = {}

    class Session:
        held = parked = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            given.update(kwargs)

        def start(self) -> None:
            given["serve"](0.25)  # a retry of the registration while Kafka is down
            scheduler.stop()

        def step(self) -> None:
            pass

        def partitions_changed(self) -> bool:
            return False

        def close(self) -> None:
            pass

    monkeypatch.setattr(runtime, "Leadership", Polled)
    monkeypatch.setattr(runtime, "LeaderSession", Session)
    scheduler.run()
    assert 0.25 in polled


def test_the_leader_s_requests_time_out_with_its_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka's send_offsets_to_transaction() waits for its request's own timeout (with a
    transactional id, transaction.timeout.ms: 60 s here), not for the call's."""
    confs: list[dict[str, Any]] = []

    def producer(conf: dict[str, Any]) -> TimingOutProducer:
        confs.append(conf)
        return TimingOutProducer()

    monkeypatch.setattr(txn_module, "Producer", producer)
    leader_transactions(Settings(bootstrap_servers="localhost:1"))
    assert confs[-1]["socket.timeout.ms"] == 5000
    leader_transactions(
        Settings(bootstrap_servers="localhost:1", kafka={"socket.timeout.ms": "9000"})
    )
    assert confs[-1]["socket.timeout.ms"] == "9000"  # `kafka` wins, as everywhere


def test_a_revocation_during_a_step_s_retries_ends_the_term_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leadership moved while a step waited to try again: the step stops there (it went on
    retrying a transaction the next leader fences, up to a minute, then exited fenced)."""
    scheduler = Scheduler(Settings(bootstrap_servers="localhost:1"))
    seen: list[str] = []

    class Revoked(FakeLeadership):
        def poll(self, timeout: float) -> None:
            if seen == ["retrying"]:
                self.is_leader = False  # the revocation arrives with this poll
            elif not self.is_leader:
                scheduler.stop()  # a standby now: the test is over

    class Session:
        held = parked = 0

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._serve = kwargs["serve"]

        def start(self) -> None:
            pass

        def step(self) -> None:
            seen.append("retrying")
            self._serve(0.1)  # between two attempts of a commit Kafka does not answer
            seen.append("retried after the revocation")

        def partitions_changed(self) -> bool:
            return False

        def close(self) -> None:
            seen.append("closed")

    monkeypatch.setattr(runtime, "Leadership", Revoked)
    monkeypatch.setattr(runtime, "LeaderSession", Session)
    assert scheduler.run() == 0
    assert seen == ["retrying", "closed"]
    assert scheduler.session is None
    # Not an abort: the leadership moved, Kafka aborted nothing.
    aborts = scheduler.metrics.registry.get_sample_value(
        "pipeline_scheduler_transaction_aborts_total"
    )
    assert aborts == 0.0


def test_a_refusal_of_the_acls_at_a_term_s_start_stops_the_scheduler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic hidden from it, or its transactional id refused: it said "could not take the
    lead; retrying" for good, and no delayed job or cron ran."""
    starts: list[int] = []

    class RefusedSession:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def start(self) -> None:
            starts.append(1)
            raise NotAuthorizedError("TOPIC", "ns.deferred", "READ", "sched", "scheduler")

        def close(self) -> None:
            pass

    monkeypatch.setattr(runtime, "Leadership", FakeLeadership)
    monkeypatch.setattr(runtime, "LeaderSession", RefusedSession)
    assert Scheduler(Settings(bootstrap_servers="localhost:1")).run() == EXIT_REFUSED
    assert starts == [1]
