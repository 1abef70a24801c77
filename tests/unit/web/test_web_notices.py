"""The notice an action leaves on the page it redirects to: shown only when the dashboard wrote
it (signed, and lately), never words a link carries."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from pydantic import SecretStr
from starlette.testclient import TestClient

from pipeline import Settings
from pipeline._errors import KafkaUnavailableError
from pipeline._job import now_ms
from pipeline._websettings import WebSettings
from pipeline_web import _letteractions, _schedules
from pipeline_web._notices import NOTICE_MAX_AGE_S, notice_of, signed_notice
from pipeline_web._schedules import ScheduleRow
from pipeline_web._security import Gate

from .conftest import T0, FakeClock, MakeDashboard
from .test_web_pages import _schedule

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from pipeline_web._dashboard import Dashboard


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def app(
    make_dashboard: MakeDashboard, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> Starlette:
    """A dashboard whose gate reads ``clock``, with one schedule, ``nightly``, that pauses."""
    rows = [ScheduleRow("nightly", _schedule("nightly"), None, None, [], "")]
    monkeypatch.setattr(_schedules, "read_rows", lambda settings, timeout: rows)
    monkeypatch.setattr(_schedules, "pause_schedule", lambda settings, name, timeout: True)
    return make_dashboard("notices", clock=clock)


def _client(app: Starlette) -> TestClient:
    return TestClient(
        app, base_url="http://127.0.0.1", client=("127.0.0.1", 50000), follow_redirects=False
    )


def _shown(page: str) -> str | None:
    """The notice a page shows, or None."""
    found = re.search(r'<p class="notice" id="notice" role="status">(.*?)</p>', page, re.S)
    return found.group(1) if found else None


def _pause(client: TestClient) -> str:
    """Pause ``nightly`` from the schedules page; where the action redirects to."""
    client.get("/schedules")
    answer = client.post(
        "/schedules/pause?name=nightly", data={"csrf": client.cookies["pipeline_csrf"]}
    )
    assert answer.status_code == 303, answer.text
    location: str = answer.headers["location"]
    return location


def test_a_link_cannot_put_words_of_its_own_on_a_page(app: Starlette) -> None:
    client = _client(app)
    lure = "Your session expired: call 555-0100 to restore it"
    for path in ("/schedules", "/dead-letters", "/"):
        page = client.get(f"{path}?{urlencode({'notice': lure})}")
        assert page.status_code == 200
        assert "555-0100" not in page.text
        assert _shown(page.text) is None
    forged = {"notice": lure, "notice_sig": f"{int(T0)}.{'0' * 64}"}
    assert "555-0100" not in client.get(f"/schedules?{urlencode(forged)}").text


def test_the_notice_of_an_action_is_shown_on_the_page_it_redirects_to(app: Starlette) -> None:
    client = _client(app)
    page = client.get(_pause(client))
    assert _shown(page.text) == "Schedule nightly paused: it fires no more until resumed."


def test_a_dead_letter_action_shows_its_notice(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_letteractions, "_act", lambda *args: _letteractions.ActionReport([], 2, 1))
    found: Dashboard = app.state.dashboard
    monkeypatch.setattr(found.letters, "refresh", lambda *args, **kwargs: None)
    client = _client(app)
    client.get("/dead-letters")
    form = {"csrf": client.cookies["pipeline_csrf"], "confirm": "yes", "at": str(now_ms())}
    answer = client.post("/dead-letters/replay", data={**form, "id": "x"})
    assert answer.status_code == 303
    shown = _shown(client.get(answer.headers["location"]).text)
    assert shown == (
        "0 dead letters replayed; 2 already replayed or discarded were left alone; 1 holds "
        "neither a job nor the raw message, so nothing to replay: discard it."
    )


def test_a_notice_with_other_words_or_too_old_is_not_shown(
    app: Starlette, clock: FakeClock
) -> None:
    client = _client(app)
    location = _pause(client)
    fields = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
    changed = {**fields, "notice": "Schedule nightly deleted: call 555-0100."}
    assert _shown(client.get(f"/schedules?{urlencode(changed)}").text) is None
    clock.now = T0 + NOTICE_MAX_AGE_S
    assert _shown(client.get(location).text) is not None
    clock.now = T0 + NOTICE_MAX_AGE_S + 1
    assert _shown(client.get(location).text) is None


def test_a_notice_signed_with_other_credentials_is_not_shown() -> None:
    token = WebSettings(token=SecretStr("one-token"))
    fields = signed_notice(Gate(token), "3 dead letters replayed.")
    assert notice_of(Gate(token), fields) == "3 dead letters replayed."  # another replica
    assert notice_of(Gate(WebSettings(token=SecretStr("other-token"))), fields) is None
    assert notice_of(Gate(WebSettings()), fields) is None


def test_an_error_text_utf8_cannot_encode_still_makes_a_notice(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(settings: Settings, name: str, timeout: float) -> None:
        raise KafkaUnavailableError("broker said \udcff")  # a lone surrogate (os.fsdecode)

    monkeypatch.setattr(_schedules, "pause_schedule", refused)
    client = _client(app)
    shown = _shown(client.get(_pause(client)).text)
    assert shown == "Could not pause nightly: broker said \\udcff"
