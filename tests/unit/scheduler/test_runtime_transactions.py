"""What the scheduler does with each kind of transaction error, without a broker.

The leadership and the leader's session are replaced by fakes; the session's step raises the
error the library's transaction loop raises for each kind of librdkafka error.
"""

from __future__ import annotations

from typing import Any

import pytest

import pipeline_scheduler._runtime as runtime
from pipeline._errors import (
    KafkaUnavailableError,
    TransactionAbortedError,
    TransactionFencedError,
)
from pipeline._settings import Settings
from pipeline_scheduler._runtime import EXIT_FENCED, Scheduler


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

        def __init__(self, *args: Any) -> None:
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
    ],
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
