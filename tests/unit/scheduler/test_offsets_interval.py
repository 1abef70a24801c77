"""The leader sends the deferred group's offsets about once a second, by the monotonic clock: a
wall clock stepped back an hour held them back for that hour (the group's lag, in ``pipeline
status`` and the exporter, stayed up), and one stepped forward sent them at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import pipeline_scheduler._session as session_module
from pipeline._settings import Settings
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._progress import PartitionProgress
from pipeline_scheduler._session import LeaderSession

from .test_held_bound import Consumer

SOURCE = ("pipeline.deferred", 0)
WALL_MS = 1_700_000_000_000


class Transaction:
    """The leader's transaction: the offsets each commit sent."""

    open = True

    def __init__(self) -> None:
        self.sent: list[list[tuple[str, int, int]]] = []

    def produce(self, *_: Any, **__: Any) -> None:
        pass

    def commit(self, offsets: Any, metadata: Any) -> None:
        self.sent.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def close(self) -> None:
        pass


class Clocks:
    def __init__(self) -> None:
        self.wall_ms = WALL_MS
        self.monotonic_s = 5_000.0

    def step(self, wall_step_ms: int, real_s: float) -> None:
        """``real_s`` pass, and the wall clock is stepped by ``wall_step_ms`` besides."""
        self.wall_ms += wall_step_ms + int(real_s * 1000)
        self.monotonic_s += real_s


@pytest.fixture
def clocks(monkeypatch: pytest.MonkeyPatch) -> Clocks:
    made = Clocks()
    monkeypatch.setattr(session_module, "now_ms", lambda: made.wall_ms)
    monkeypatch.setattr(session_module, "monotonic", lambda: made.monotonic_s, raising=False)
    return made


@pytest.fixture
def session() -> Iterator[LeaderSession]:
    # No broker is contacted: the transaction and the consumer are fakes.
    made = LeaderSession(Settings(bootstrap_servers="localhost:1"), SchedulerMetrics(), [])
    made._consumer = Consumer()  # type: ignore[assignment]
    made.txn = Transaction()  # type: ignore[assignment]
    made.progress[SOURCE] = PartitionProgress(0)
    try:
        yield made
    finally:
        made._consumer = None
        made.close()


def route_and_commit(session: LeaderSession, offset: int) -> list[tuple[str, int, int]]:
    """Route the message at ``offset`` (skipped: nothing held) and commit; what was sent."""
    progress = session.progress[SOURCE]
    progress.delivered(offset)
    progress.processed(offset)
    session._commit()
    txn: Transaction = session.txn  # type: ignore[assignment]
    return txn.sent[-1]


@pytest.mark.parametrize("step_ms", [-3_600_000, 3_600_000, 0])
def test_offsets_are_sent_a_second_after_the_last_whatever_the_wall_clock_does(
    session: LeaderSession, clocks: Clocks, step_ms: int
) -> None:
    assert route_and_commit(session, 0) == [(*SOURCE, 1)]  # the first commit sends them
    clocks.step(step_ms, 0.5)
    assert route_and_commit(session, 1) == []  # half a second later: they wait
    clocks.step(0, 0.6)
    assert route_and_commit(session, 2) == [(*SOURCE, 3)]
