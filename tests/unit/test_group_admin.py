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
