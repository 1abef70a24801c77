"""How ``pipeline topics apply`` waits for the group configs it set to show everywhere."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from pipeline import _groupadmin

WANTED = {"ns.workers": {"consumer.heartbeat.interval.ms": "1000"}}
FRESH = {"ns.workers": {"consumer.heartbeat.interval.ms": "1000"}}
STALE: dict[str, dict[str, str | None]] = {"ns.workers": {"consumer.heartbeat.interval.ms": None}}


def _answers(monkeypatch: pytest.MonkeyPatch, answers: Iterable[Any]) -> list[Any]:
    """Each read of the group configs answers the next of ``answers`` (as brokers would, one
    behind the metadata log among them); returns the reads made."""
    made: list[Any] = []
    source: Iterator[Any] = iter(answers)

    def read(session: Any, groups: Iterable[str]) -> Any:
        made.append(next(source))
        return made[-1]

    monkeypatch.setattr(_groupadmin, "_read", read)
    monkeypatch.setattr("pipeline._groupadmin.time.sleep", lambda seconds: None)
    return made


@pytest.mark.parametrize("brokers", [2, 3])
def test_the_new_values_must_show_in_several_reads_in_a_row(
    monkeypatch: pytest.MonkeyPatch, brokers: int
) -> None:
    """Any broker may answer a read: one that shows the new values while the next broker
    still shows the old ones is not enough."""
    reads = _answers(monkeypatch, [STALE, FRESH, STALE, FRESH, FRESH, FRESH, STALE])
    session = SimpleNamespace(remaining=lambda: 30.0)
    _groupadmin._wait_visible(session, WANTED, brokers)  # type: ignore[arg-type]
    assert reads == [STALE, FRESH, STALE, FRESH, FRESH, FRESH]


def test_one_read_that_shows_them_is_enough_on_a_single_broker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = _answers(monkeypatch, [STALE, FRESH, STALE])
    _groupadmin._wait_visible(SimpleNamespace(remaining=lambda: 30.0), WANTED, 1)  # type: ignore[arg-type]
    assert reads == [STALE, FRESH]


def test_the_wait_ends_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]

    def read(session: Any, groups: Iterable[str]) -> Any:
        clock[0] += 1.0
        return STALE

    monkeypatch.setattr(_groupadmin, "_read", read)
    monkeypatch.setattr("pipeline._groupadmin.time.sleep", lambda seconds: None)
    monkeypatch.setattr("pipeline._groupadmin.time.monotonic", lambda: clock[0])
    _groupadmin._wait_visible(SimpleNamespace(remaining=lambda: 30.0), WANTED, 3)  # type: ignore[arg-type]
    assert clock[0] == _groupadmin.VISIBLE_WAIT_S


class _Session(SimpleNamespace):
    """What ``_apply`` asks of an admin session, with ``brokers`` in the cluster; the changes
    it makes are kept in ``altered``."""

    def __init__(self, brokers: int) -> None:
        super().__init__(remaining=lambda: 30.0, brokers=brokers, altered=[])

    def metadata(self) -> Any:
        return SimpleNamespace(brokers=dict.fromkeys(range(self.brokers)))


def _applied(monkeypatch: pytest.MonkeyPatch, session: _Session) -> list[Any]:
    def alter(session: Any, changes: Iterable[Any], *, validate_only: bool) -> None:
        session.altered.extend(changes)

    monkeypatch.setattr(_groupadmin, "_alter", alter)
    return _groupadmin._apply(session, WANTED, dry_run=False)  # type: ignore[arg-type]


def test_a_value_set_a_moment_ago_is_not_set_again_when_a_lagging_broker_answers_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An apply run right after another: the first read comes from a broker behind the
    metadata log; the next shows the value set (the controller has it): nothing changes."""
    reads = _answers(monkeypatch, [STALE, FRESH, STALE])
    session = _Session(brokers=3)
    assert _applied(monkeypatch, session) == []
    assert session.altered == []
    assert reads == [STALE, FRESH]


@pytest.mark.parametrize(("brokers", "reads_before"), [(1, 1), (3, _groupadmin.VISIBLE_READS)])
def test_a_value_every_read_shows_unset_is_set(
    monkeypatch: pytest.MonkeyPatch, brokers: int, reads_before: int
) -> None:
    reads = _answers(monkeypatch, [STALE] * reads_before + [FRESH] * 3)
    session = _Session(brokers=brokers)
    changes = _applied(monkeypatch, session)
    assert [(c.key, c.current, c.wanted) for c in changes] == [
        ("consumer.heartbeat.interval.ms", None, "1000")
    ]
    assert session.altered == changes
    assert reads[:reads_before] == [STALE] * reads_before


def test_a_value_no_read_shows_as_wanted_is_set_whatever_each_read_shows_instead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One broker still shows the default, another a value set since (not the wanted one)."""
    other = {"ns.workers": {"consumer.heartbeat.interval.ms": "5000"}}
    _answers(monkeypatch, [STALE, other, STALE] + [FRESH] * 3)
    session = _Session(brokers=3)
    changes = _applied(monkeypatch, session)
    assert [(c.key, c.current, c.wanted) for c in changes] == [
        ("consumer.heartbeat.interval.ms", None, "1000")
    ]
    assert session.altered == changes
