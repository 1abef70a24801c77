"""A process that holds the lead but cannot start its term gives the lead up, without a broker.

The runtime's real loop runs with a fake leadership group (which hands the lead back after a
leave, as Kafka does where no other scheduler is) and fake leader sessions whose start fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import pipeline_scheduler._runtime as runtime
from pipeline._brokerhealth import BrokerHealth
from pipeline._errors import KafkaUnavailableError
from pipeline._settings import Settings
from pipeline_scheduler._runtime import Scheduler
from tests.waiting import wait_for

Failing = Callable[..., "Run"]
"""``failing(start, retry_s=0.01)``: a scheduler's loop whose sessions' start is ``start``."""
STATE_TIMEOUT = "reading pipeline.scheduler-state took longer than 60s"


class LoneLeadership:
    """The leadership group of a lone scheduler: a leave gives the lead up, the rejoin gets it
    back."""

    handover_s = 0.0

    def __init__(self, settings: Settings) -> None:
        self.is_leader = True
        self.events: list[str] = []

    def poll(self, timeout: float) -> None:
        pass

    def leave(self) -> None:
        self.is_leader = False
        self.events.append("leave")

    def rejoin(self) -> None:
        self.is_leader = True
        self.events.append("rejoin")

    def close(self) -> None:
        self.is_leader = False


class Run:
    """A scheduler's loop on a thread, its sessions' start being ``start``."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, start: Callable[[], None], retry_s: float
    ) -> None:
        monkeypatch.setattr(runtime, "START_RETRY_S", retry_s, raising=False)
        self.starts = 0
        self.health: list[tuple[bool, str]] = []
        run = self

        class FailingSession:
            held = parked = 0

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                pass

            def start(self) -> None:
                run.starts += 1
                run.leadership.events.append("start")
                run.health.append(run.scheduler.health())
                start()

            def close(self) -> None:
                pass

        monkeypatch.setattr(runtime, "Leadership", LoneLeadership)
        monkeypatch.setattr(runtime, "LeaderSession", FailingSession)
        self.scheduler = Scheduler(Settings(bootstrap_servers="localhost:1"))
        self.thread = threading.Thread(target=self.scheduler.run, daemon=True)
        self.thread.start()
        assert wait_for(lambda: self.scheduler._leadership is not None, 5)

    @property
    def leadership(self) -> LoneLeadership:
        leadership = self.scheduler._leadership
        assert isinstance(leadership, LoneLeadership)
        return leadership

    def stop(self) -> None:
        self.scheduler.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def failing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Failing]:
    # A tracker of its own: the process's tracker of this address may have seen it unreachable
    # for longer than the health's limit, in another test of the same process.
    monkeypatch.setattr(BrokerHealth, "_trackers", {})
    runs: list[Run] = []

    def start(start: Callable[[], None], retry_s: float = 0.01) -> Run:
        runs.append(Run(monkeypatch, start, retry_s))
        return runs[-1]

    yield start
    for run in runs:
        run.stop()


def unavailable() -> None:
    raise KafkaUnavailableError(STATE_TIMEOUT)


def test_the_lead_is_given_up_after_three_failed_starts_and_taken_again_when_no_one_else_can(
    failing: Failing,
) -> None:
    run = failing(unavailable)
    assert wait_for(lambda: run.leadership.events.count("rejoin") >= 2, 5), (
        f"{run.starts} failed starts, and the lead still held: {run.leadership.events}"
    )
    # Three starts per turn at the lead: the rejoin gives it back (no other scheduler).
    turn = ["start", "start", "start", "leave", "rejoin"]
    assert run.leadership.events[:10] == turn + turn
    # Trying again is all it can do: never unhealthy, and a leader, not a standby, in the reason.
    assert all(ok for ok, _ in run.health)
    assert run.health[0][1] == "leader, starting its term"
    assert run.health[2][1] == (
        f"leader, starting its term (2 failed starts, the last: {STATE_TIMEOUT})"
    )


def test_the_lead_is_given_up_when_a_slow_start_failed_past_the_time_budget(
    failing: Failing, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "START_BUDGET_S", 0.2, raising=False)
    slow = threading.Event()

    def start() -> None:
        slow.wait(0.3)  # a state read that times out, in short
        unavailable()

    run = failing(start)
    assert wait_for(lambda: "leave" in run.leadership.events, 5), run.leadership.events
    assert run.leadership.events[:2] == ["start", "leave"]


def test_healthz_says_leader_without_a_term_between_failed_starts(
    failing: Failing, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = failing(unavailable, 60.0)
    assert wait_for(lambda: run.starts == 1 and run.scheduler._failed_starts == 1, 5)
    assert run.scheduler.health() == (
        True,
        f"leader without a term (1 failed start, the last: {STATE_TIMEOUT})",
    )


def test_healthz_fails_when_a_start_runs_past_the_budget_and_not_before(
    failing: Failing, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "START_BUDGET_S", 0.5, raising=False)
    monkeypatch.setattr(runtime, "STALL_S", 0.0, raising=False)  # any wait is a stall
    stuck = threading.Event()

    def start() -> None:
        stuck.wait(10)
        unavailable()

    run = failing(start)
    assert wait_for(lambda: run.starts == 1, 5)
    # Before the budget a start is not a stall of the loop, however long it takes.
    assert run.scheduler.health() == (True, "leader, starting its term")
    assert wait_for(lambda: run.scheduler.health()[0] is False, 5), run.scheduler.health()
    reason = run.scheduler.health()[1]
    assert reason.startswith("leader, starting its term: stuck, the start of its term has run")
    assert "no other scheduler can take it until it is restarted" in reason
    alive, why = run.scheduler.live()  # a restart is what mends it
    assert not alive
    assert why.startswith("leader, starting its term: stuck"), why
    stuck.set()
