"""Catching up after a gap: every fire within ``misfire_grace_s`` fires exactly once, at most
``max_catchup_fires`` per step, also across a takeover in the middle (fake clock, no broker)."""

from __future__ import annotations

import pytest

from pipeline._codec import ScheduleCodec
from pipeline._records import Schedule
from pipeline._schedule import make_schedule
from pipeline._settings import Settings
from pipeline._transactions import Transactions
from pipeline_scheduler import _state
from pipeline_scheduler._cron import CronTable
from pipeline_scheduler._metrics import SchedulerMetrics
from pipeline_scheduler._session import LeaderSession
from pipeline_scheduler._state import load_state
from tests.unit.scheduler.test_session_schedules import Message
from tests.unit.test_transactions import FakeProducer

EVERY_SECOND = "* * * * * *"
LAST = 1_700_000_000_000  # a fire time (a whole second)


def every_second(missed: str = "skip") -> Schedule:
    made = make_schedule("s", cron=EVERY_SECOND, job_type="t", missed=missed)
    made.created_at = LAST - 3_600_000
    return made


def run(table: CronTable, now: int, cap: int, tick_ms: int = 50) -> list[int]:
    """Steps of the leader at ``now``, ``now + tick_ms``...: until nothing overdue is left."""
    fired: list[int] = []
    while (due := table.next_due()) is not None and due <= now:
        fires = table.due(now)
        assert len(fires) <= cap
        fired += [f.fire_ms for f in fires if f.fire_ms is not None]
        now += tick_ms
    return fired


def test_every_fire_within_grace_fires_once_however_many() -> None:
    # Down for 30 minutes, grace one hour: 1,800 late fires, nearly twice the cap. The cap
    # kept the newest 1,000 and the other 800 were dropped without a word.
    table = CronTable(grace_ms=3_600_000, max_catchup=1000)
    table.load_last_fires({"s": LAST})
    table.put("s", every_second())
    now = LAST + 1_800_000 + 300
    fired = run(table, now, cap=1000)
    assert fired == [LAST + 1000 * i for i in range(1, 1801)]


def test_once_fires_the_newest_missed_fire_and_every_late_one() -> None:
    # 600 missed fires, then 1,500 late ones: the missed fire was lost too, since the cap's
    # newest fires were all late.
    table = CronTable(grace_ms=1_500_000, max_catchup=1000)
    table.load_last_fires({"s": LAST})
    table.put("s", every_second("once"))
    now = LAST + 2_100_000 + 300
    fired = run(table, now, cap=1000)
    assert fired == [LAST + 600_000] + [LAST + 1000 * i for i in range(601, 2101)]


def test_all_fires_the_newest_missed_fires_up_to_the_cap_and_every_late_one() -> None:
    table = CronTable(grace_ms=1_500_000, max_catchup=1000)
    table.load_last_fires({"s": LAST})
    table.put("s", every_second("all"))
    now = LAST + 3_000_000 + 300  # 1,500 missed fires, 1,500 late ones
    fired = run(table, now, cap=1000)
    assert fired == [LAST + 1000 * i for i in range(501, 3001)]


def test_a_schedule_changed_during_its_catch_up_fires_from_its_change() -> None:
    table = CronTable(grace_ms=3_600_000, max_catchup=1000)
    table.load_last_fires({"s": LAST})
    table.put("s", every_second())
    now = LAST + 1_800_000 + 300
    assert len(table.due(now)) == 1000
    changed = every_second()
    changed.created_at = now + 100  # a schedule never fires for times before it existed
    table.put("s", changed)
    assert table.next_due() == LAST + 1_801_000
    assert table.due(now + 200) == []


def leader(settings: Settings) -> LeaderSession:
    made = LeaderSession(settings, SchedulerMetrics(), [])
    made.txn = Transactions(FakeProducer(), name="test producer", sleep=lambda s: None)
    made.firing.ready = True
    record = ScheduleCodec().encode(every_second())
    made.firing.read(Message(b"s", record, 0))  # type: ignore[arg-type]
    return made


def step(session: LeaderSession, now: int) -> None:
    """One step's fires, committed: at most the cap (``max_catchup_fires``) of them."""
    session.firing.fire(now, session.txn, "acme")
    session.txn.commit()
    producer: FakeProducer = session.txn.producer  # type: ignore[assignment]
    jobs = [topic for topic, _ in producer.committed[-1] if topic == "acme.jobs.default"]
    assert len(jobs) <= session.settings.scheduler.max_catchup_fires


def committed(session: LeaderSession, topic: str) -> list[tuple[bytes, bytes | None]]:
    producer: FakeProducer = session.txn.producer  # type: ignore[assignment]
    assert producer.calls[-1] == "commit_transaction"  # nothing left uncommitted
    return [(key or b"", value) for t, value, key, _, _ in producer.produced if t == topic]


def fire_times(session: LeaderSession) -> list[int]:
    return [int(key.rsplit(b":", 1)[1]) for key, _ in committed(session, "acme.jobs.default")]


def test_a_takeover_in_the_middle_of_a_catch_up_loses_and_doubles_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Grace 10 s, 2 fires a step: a leader back 10.5 s after the last fire has 10 late fires
    # to make; it makes 2, commits, and dies. Its successor takes over 3 s later, when the
    # third fire is 10.5 s old: judged again, it would be missed and skipped.
    settings = Settings(
        bootstrap_servers="localhost:1",
        namespace="acme",
        scheduler={"misfire_grace_s": 10, "max_catchup_fires": 2},
    )
    first = leader(settings)
    first.firing.cron.load_last_fires({"s": LAST})
    now = LAST + 10_500
    try:
        step(first, now)
        before = fire_times(first)
        records = [(k.decode(), v) for k, v in committed(first, "acme.scheduler-state")]
    finally:
        first.close()
    assert before == [LAST + 1000, LAST + 2000]
    monkeypatch.setattr(_state, "read_table", lambda *args, **kwargs: records)
    state = load_state(settings)  # what a new leader's start() reads, and loads as below
    assert (state.last_fires, state.catch_ups) == ({"s": LAST + 2000}, {"s": now})
    second = leader(settings)
    second.firing.cron.load_last_fires(state.last_fires, state.catch_ups)
    now += 3000
    try:
        steps = 0
        while (due := second.firing.next_due()) is not None and due <= now:
            step(second, now)
            steps += 1
            now += 50
        after = fire_times(second)
    finally:
        second.close()
    assert before + after == [LAST + 1000 * i for i in range(1, 14)]
    assert steps == 6  # 11 fires, 2 a step
