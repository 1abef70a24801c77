"""The dashboard's writes say what they did: a replay that failed part-way counts the letters
its committed batches replayed (in the notice and the audit line), with the error as raised
rather than the monitor's "unreachable"; a pause of a paused schedule wrote nothing; and a
filter or a fire time the CLI refuses is a 400 here too."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest

from pipeline import Settings
from pipeline._deadletters import StoredLetter
from pipeline._deadletters._replay import _after
from pipeline._errors import KafkaUnavailableError
from pipeline._job import now_ms
from pipeline_web import _letteractions, _schedules
from pipeline_web._monitor import Outage

from .test_web_pages import (
    _add_letter,
    _client,
    _confirmation,
    _csrf,
    _notice,
    _schedule_actions,
    _Topic,
    dashboard,
    topic,
)

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["topic"]  # the fixture


@pytest.fixture
def app(make_dashboard: Any) -> Starlette:
    made: Starlette = make_dashboard("pages")
    return made


def _audited(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        json.loads(r.getMessage())
        for r in caplog.records
        if r.name == "pipeline.web.audit" and r.levelno == logging.INFO
    ]


def test_a_replay_that_failed_part_way_says_how_many_letters_it_replayed(
    app: Starlette,
    topic: _Topic,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for n in range(3):
        topic.add(_add_letter(app, now_ms() - 60_000 + n, "report.build"))
    monitor = dashboard(app).monitor

    def replay(settings: Settings, todo: list[StoredLetter], **kwargs: Any) -> Any:
        # The first batch committed; then Kafka stopped answering, and the monitor's readings
        # found it unreachable meanwhile.
        monitor.outage = Outage(1_796_000_000.0, "Connection refused")
        error = KafkaUnavailableError("Kafka did not answer within 30s")
        raise _after(error, todo[:2])

    monkeypatch.setattr(_letteractions, "replay_letters", replay)
    client = _client(app)
    token = _csrf(client)
    asked = client.post("/dead-letters/replay", data={"csrf": token, "type": "report.*"})
    with caplog.at_level(logging.INFO, logger="pipeline.web.audit"):
        answer = client.post("/dead-letters/replay", data=_confirmation(asked.text))
    notice = _notice(answer.headers["location"])
    assert notice.startswith("The replay failed: Kafka did not answer within 30s"), notice
    assert "2 dead letters were done in the batches committed before" in notice
    [line] = _audited(caplog)
    assert line["action"] == "dlq.replay"
    assert line["count"] == 2


def test_an_action_with_kafka_found_unreachable_writes_nothing(
    app: Starlette, topic: _Topic
) -> None:
    topic.add(_add_letter(app, now_ms() - 60_000, "report.build"))
    client = _client(app)
    token = _csrf(client)
    asked = client.post("/dead-letters/replay", data={"csrf": token, "type": "report.*"})
    dashboard(app).monitor.outage = Outage(1_796_000_000.0, "Connection refused")
    answer = client.post("/dead-letters/replay", data=_confirmation(asked.text))
    assert "Kafka is unreachable since" in _notice(answer.headers["location"])
    assert topic.replayed == []


def test_pausing_a_paused_schedule_says_so_and_audits_nothing_done(
    app: Starlette, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _schedule_actions(monkeypatch, ("nightly",))
    monkeypatch.setattr(_schedules, "pause_schedule", lambda settings, name, timeout: False)
    monkeypatch.setattr(_schedules, "resume_schedule", lambda settings, name, timeout: False)
    client = _client(app)
    token = _csrf(client)
    with caplog.at_level(logging.INFO, logger="pipeline.web.audit"):
        paused = client.post("/schedules/pause?name=nightly", data={"csrf": token})
        resumed = client.post("/schedules/resume?name=nightly", data={"csrf": token})
    assert _notice(paused.headers["location"]) == "Schedule nightly was paused already."
    assert _notice(resumed.headers["location"]) == "Schedule nightly was not paused."
    assert [line["count"] for line in _audited(caplog)] == [0, 0]


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ({"since": "99999999999999999999w"}, "since: '99999999999999999999w' is out of range"),
        ({"until": "99999999999999999999w"}, "until: '99999999999999999999w' is out of range"),
        ({"reason": "max_attempt"}, "reason: 'max_attempt' is none of"),
        ({"since": "1h", "until": "2h"}, "since must be before until"),
    ],
)
def test_a_filter_the_cli_refuses_is_a_400(
    app: Starlette, query: dict[str, str], said: str
) -> None:
    page = _client(app).get("/dead-letters", params=query)
    assert page.status_code == 400
    assert said in page.text.replace("&#39;", "'")


def test_a_known_reason_in_any_case_is_kept(app: Starlette) -> None:
    page = _client(app).get("/dead-letters", params={"reason": "Max_Attempts"})
    assert page.status_code == 200


@pytest.mark.parametrize("at", ["-5", "1_000", "99999999999999999999"])
def test_a_trigger_s_fire_time_must_be_epoch_milliseconds(
    app: Starlette, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    calls = _schedule_actions(monkeypatch, ("nightly",))
    client = _client(app)
    answer = client.post("/schedules/trigger?name=nightly", data={"csrf": _csrf(client), "at": at})
    assert answer.status_code == 400
    assert calls == []


@pytest.mark.parametrize("at", ["-5", "1_000", "99999999999999999999"])
@pytest.mark.parametrize("action", ["replay", "discard"])
def test_a_bulk_action_s_pinned_time_must_be_epoch_milliseconds(
    app: Starlette, topic: _Topic, action: str, at: str
) -> None:
    """Past the year 9999 it was taken, and the page said "dead before 99999999999999999999"."""
    topic.add(_add_letter(app, now_ms() - 60_000, "report.build"))
    client = _client(app)
    asked = client.post(f"/dead-letters/{action}", data={"csrf": _csrf(client), "type": "report.*"})
    answer = client.post(f"/dead-letters/{action}", data={**_confirmation(asked.text), "at": at})
    assert answer.status_code == 400
    assert f"'at' must be epoch milliseconds, got {at!r}" in answer.text
    assert topic.replayed == []
