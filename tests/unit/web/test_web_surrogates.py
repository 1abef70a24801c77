"""Text that UTF-8 cannot encode (a lone surrogate: JSON's ``"\\ud83d"``, or what
``os.fsdecode`` makes of bytes that are not UTF-8) in a letter, in Kafka's error or in an
action's error is shown escaped (``\\ud83d``): the page, the refusal and the audit line still
go out."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NoReturn

import pytest

from pipeline._errors import KafkaUnavailableError
from pipeline._job import Job
from pipeline_web import _schedules
from pipeline_web._schedules import ScheduleRow

from .conftest import MakeDashboard
from .test_web_pages import _client, _csrf, _schedule, dashboard, serve_letter

if TYPE_CHECKING:
    from pathlib import Path

    from starlette.applications import Starlette

BROKEN = "broker said \udcff"
SHOWN = "broker said \\udcff"


@pytest.fixture
def app(make_dashboard: MakeDashboard, monkeypatch: pytest.MonkeyPatch) -> Starlette:
    rows = [ScheduleRow("nightly", _schedule("nightly"), None, None, [], "")]
    monkeypatch.setattr(_schedules, "read_rows", lambda settings, timeout: rows)
    return make_dashboard("surrogates")


@pytest.mark.parametrize("path", ["/", "/workers", "/jobs", "/dead-letters", "/schedules"])
def test_every_page_shows_a_kafka_error_holding_a_lone_surrogate(app: Starlette, path: str) -> None:
    dashboard(app).monitor.problem = BROKEN
    page = _client(app).get(path)
    assert page.status_code == 200
    assert f"Kafka could not be read: {SHOWN}" in page.text


def test_a_refusal_repeating_an_error_holding_a_lone_surrogate_is_sent(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreadable(ident: str, timeout: float) -> NoReturn:
        raise KafkaUnavailableError(BROKEN)

    monkeypatch.setattr(dashboard(app).letters, "get", unreadable)
    answer = _client(app).get("/dead-letters/dl-1")
    assert answer.status_code == 503
    assert answer.text == SHOWN


def test_a_letter_whose_fields_hold_lone_surrogates_has_its_page(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = Job(id="job-\ud83d", type="email.\udcff", payload=b"{}", headers={"h\ud83d": "v\udcff"})
    letter = serve_letter(app, monkeypatch, job, "smtp \ud83d")
    page = _client(app).get(f"/dead-letters/{letter.id}")
    assert page.status_code == 200
    assert "<code>job-\\ud83d</code>" in page.text
    assert "/jobs?id=job-%5Cud83d" in page.text


def test_an_action_failing_with_a_lone_surrogate_is_audited_to_the_file(
    make_dashboard: MakeDashboard, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def refused(settings: object, name: str, timeout: float) -> NoReturn:
        raise KafkaUnavailableError(BROKEN)

    monkeypatch.setattr(_schedules, "pause_schedule", refused)
    audit_log = tmp_path / "audit.jsonl"
    app = make_dashboard("surrogates", audit_log=str(audit_log))
    client = _client(app)
    answer = client.post("/schedules/pause?name=nightly", data={"csrf": _csrf(client)})
    assert answer.status_code == 303
    (line,) = audit_log.read_text(encoding="utf-8").splitlines()
    entry = json.loads(line)
    assert (entry["action"], entry["count"], entry["outcome"]) == ("schedule.pause", 0, BROKEN)
