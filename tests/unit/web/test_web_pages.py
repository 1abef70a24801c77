"""The dashboard's pages and actions through its ASGI application, on a Kafka that does not
answer (nothing listens on port 1): what they do with odd input, odd names and failed reads.
The Kafka operations of the actions are replaced by recorders."""

from __future__ import annotations

import asyncio
import html
import re
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urljoin, urlsplit

import pytest
from starlette.testclient import TestClient

from pipeline import Settings
from pipeline._deadletters import (
    DeadLetterSnapshot,
    LetterFilter,
    LetterState,
    LetterStatus,
    StoredLetter,
    WriteReport,
)
from pipeline._errors import KafkaUnavailableError
from pipeline._job import Job, now_ms
from pipeline._records import DeadLetter, Schedule
from pipeline_web import _letteractions, _schedules
from pipeline_web._schedules import ScheduleRow

from .conftest import MakeDashboard

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from pipeline_web._dashboard import Dashboard


@pytest.fixture
def app(make_dashboard: MakeDashboard) -> Starlette:
    return make_dashboard("pages")


def dashboard(app: Starlette) -> Dashboard:
    found: Dashboard = app.state.dashboard
    return found


def serve_letter(
    app: Starlette, monkeypatch: pytest.MonkeyPatch, job: Job, message: str
) -> DeadLetter:
    """A dead letter of ``job`` (failed with ``message``) that the dashboard finds by its id."""
    letter = DeadLetter(
        reason="max_attempts",
        message=message,
        source_topic="pages.jobs.default",
        source_partition=0,
        source_offset=0,
        job=job,
        dead_at=1_000,
    )
    stored = StoredLetter(letter, 0, 0)
    monkeypatch.setattr(dashboard(app).letters, "get", lambda ident, timeout: stored)
    return letter


def _client(app: Starlette, host: str = "127.0.0.1") -> TestClient:
    return TestClient(
        app, base_url=f"http://{host}", client=("127.0.0.1", 50000), follow_redirects=False
    )


def _csrf(client: TestClient) -> str:
    client.get("/dead-letters")
    token = client.cookies.get("pipeline_csrf")
    assert token
    return token


def _letter(dead_at: int, job_type: str = "email.send") -> DeadLetter:
    job = Job(id=f"job-{dead_at}", type=job_type, payload=b"{}")
    return DeadLetter(
        reason="max_attempts",
        message="smtp timed out",
        source_topic="pages.jobs.default",
        source_partition=0,
        source_offset=0,
        job=job,
        dead_at=dead_at,
    )


def _add_letter(app: Starlette, dead_at: int, job_type: str = "email.send") -> DeadLetter:
    """A pending dead letter in the index, as a refresh would fold it in."""
    letter = _letter(dead_at, job_type)
    index = dashboard(app).letters
    with index._lock:
        index._fold([StoredLetter(letter, 0, 0)], [])
    return letter


class _Acted:
    """Stands for :func:`_letteractions._act`: records the filter and acts on nothing."""

    def __init__(self) -> None:
        self.filters: list[LetterFilter] = []

    def __call__(self, *args: Any) -> _letteractions.ActionReport:
        self.filters.append(args[2])
        return _letteractions.ActionReport([], 0)


@pytest.fixture
def acted(app: Starlette, monkeypatch: pytest.MonkeyPatch) -> _Acted:
    """The actions act on nothing, and the index refresh after them reads nothing."""
    recorder = _Acted()
    monkeypatch.setattr(_letteractions, "_act", recorder)
    monkeypatch.setattr(dashboard(app).letters, "refresh", lambda *args, **kwargs: None)
    return recorder


def _notice(location: str) -> str:
    return parse_qs(urlsplit(location).query)["notice"][0]


# --- the host name ------------------------------------------------------------------------------


def test_without_credentials_a_page_asked_for_under_another_host_name_is_refused(
    app: Starlette,
) -> None:
    assert _client(app, "127.0.0.1:8180").get("/dead-letters").status_code == 200
    assert _client(app, "localhost:8180").get("/dead-letters").status_code == 200
    foreign = _client(app, "attacker.example:8180").get("/dead-letters")
    assert foreign.status_code == 400
    assert "set-cookie" not in foreign.headers


# --- schedules ----------------------------------------------------------------------------------


def _schedule(name: str) -> Schedule:
    return Schedule(name=name, cron="0 * * * *", job_type="report.build", payload=b"{}")


def _schedule_actions(
    monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]
) -> list[tuple[str, object]]:
    """Schedules of ``names`` on the page; the pauses and triggers asked of them, recorded."""
    rows = [ScheduleRow(n, _schedule(n), None, None, [], "") for n in names]
    monkeypatch.setattr(_schedules, "read_rows", lambda settings, timeout: rows)
    calls: list[tuple[str, object]] = []

    def pause(settings: Settings, name: str, timeout: float) -> bool:
        calls.append(("pause", name))
        return True  # it was not paused: the record was written

    monkeypatch.setattr(_schedules, "pause_schedule", pause)

    def trigger(settings: Settings, name: str, at: int, timeout: float) -> Job:
        calls.append(("trigger", name))
        return Job(id=f"fire-{at}", type="report.build", payload=b"{}")

    monkeypatch.setattr(_schedules, "trigger_schedule", trigger)
    return calls


def test_a_schedule_whose_name_holds_a_slash_can_be_paused_and_triggered(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _schedule_actions(monkeypatch, ("team/nightly", "plain"))
    client = _client(app)
    page = client.get("/schedules").text
    token = client.cookies["pipeline_csrf"]
    for action in re.findall(r'action="(/schedules/[^"]+)"', page):
        answer = client.post(action, data={"csrf": token, "at": "1800000000000"})
        assert answer.status_code == 303, (action, answer.text)
    assert sorted(calls) == [
        ("pause", "plain"),
        ("pause", "team/nightly"),
        ("trigger", "plain"),
        ("trigger", "team/nightly"),
    ]


@pytest.mark.parametrize(
    "name", [".", "..", "team/./nightly", "team/../plain", "team/nightly/..", "a\r\nb", "%2e"]
)
def test_an_action_acts_on_the_schedule_of_its_row_whatever_dots_its_name_holds(
    app: Starlette, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # A browser removes the "." and ".." segments of a form's URL before it posts it, "%2e"
    # too: a name holding them (or being one) must still be acted on, and never turn into
    # the name of another schedule.
    others = ("team/nightly", "plain", "team", "pause", "trigger")
    calls = _schedule_actions(monkeypatch, (name, *others))
    client = _client(app)
    page = client.get("/schedules").text
    row = page.split(f'data-name="{html.escape(name)}"', 1)[1].split("</tr>", 1)[0]
    token = client.cookies["pipeline_csrf"]
    for action in re.findall(r'action="(/schedules/[^"]+)"', row):
        sent = urljoin("http://127.0.0.1/schedules", html.unescape(action))  # as a browser does
        answer = client.post(sent, data={"csrf": token, "at": "1800000000000"})
        assert answer.status_code == 303, (sent, answer.text)
    assert sorted(calls) == [("pause", name), ("trigger", name)]


# --- dead letters: input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query", ["page=%C2%B2", "page=" + "9" * 5000, "page=-1", "since=" + "9" * 400 + "s"]
)
def test_a_malformed_list_query_is_a_bad_request(app: Starlette, query: str) -> None:
    answer = _client(app).get(f"/dead-letters?{query}")
    assert answer.status_code == 400


@pytest.mark.parametrize(
    "form",
    [
        {"confirm": "yes", "at": "\u00b2", "id": "x"},
        {"confirm": "yes", "at": "9" * 5000, "id": "x"},
        {"since": "9" * 400 + "s"},
    ],
)
def test_a_malformed_action_form_is_a_bad_request(
    app: Starlette, acted: _Acted, form: dict[str, str]
) -> None:
    client = _client(app)
    answer = client.post("/dead-letters/replay", data={"csrf": _csrf(client), **form})
    assert answer.status_code == 400
    assert acted.filters == []


# --- dead letters: actions ----------------------------------------------------------------------


def test_an_action_that_ran_redirects_with_its_notice_when_the_list_cannot_be_refreshed(
    app: Starlette, acted: _Acted, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise KafkaUnavailableError("pages.dlq not read to the end")

    monkeypatch.setattr(dashboard(app).letters, "refresh", unreachable)
    client = _client(app)
    form = {"csrf": _csrf(client), "confirm": "yes", "at": str(now_ms()), "id": "x"}
    answer = client.post("/dead-letters/replay", data=form)
    assert answer.status_code == 303
    assert len(acted.filters) == 1
    notice = _notice(answer.headers["location"])
    assert notice.startswith("0 dead letters replayed")
    assert "list not refreshed" in notice


def test_a_letter_replayed_from_its_page_is_found_however_far_ahead_the_workers_clock(
    app: Starlette, acted: _Acted
) -> None:
    letter = _add_letter(app, dead_at=now_ms() + 120_000)  # the worker's clock runs ahead
    client = _client(app)
    token = _csrf(client)
    confirm = client.post("/dead-letters/replay", data={"csrf": token, "id": letter.id})
    assert "Replay 1 dead letter?" in " ".join(confirm.text.split())
    at = re.search(r'name="at" value="(\d+)"', confirm.text)
    assert at is not None
    form = {"csrf": token, "id": letter.id, "confirm": "yes", "at": at.group(1)}
    assert client.post("/dead-letters/replay", data=form).status_code == 303
    assert acted.filters == [LetterFilter(ids=(letter.id,))]


def test_a_bulk_action_stays_pinned_to_the_time_of_its_count(app: Starlette, acted: _Acted) -> None:
    _add_letter(app, dead_at=now_ms() + 120_000, job_type="report.build")
    client = _client(app)
    token = _csrf(client)
    confirm = client.post("/dead-letters/discard", data={"csrf": token, "type": "report.*"})
    assert "Discard 0 dead letters?" in " ".join(confirm.text.split())
    form = {"csrf": token, "type": "report.*", "confirm": "yes", "at": "1800000000000"}
    client.post("/dead-letters/discard", data=form)
    assert acted.filters == [LetterFilter(types=("report.*",), until=1_800_000_000_000)]


class _Topic:
    """Stands for ``<ns>.dlq`` as a fresh read sees it, and for the replay that writes to it:
    records the ids it replayed, and marks them replayed for the next read."""

    def __init__(self) -> None:
        self.stored: list[StoredLetter] = []
        self.replayed: list[str] = []

    def add(self, letter: DeadLetter) -> None:
        self.stored.append(StoredLetter(letter, 0, len(self.stored)))

    def read(self, *args: Any, **kwargs: Any) -> DeadLetterSnapshot:
        return DeadLetterSnapshot("pages.dlq", [replace(s) for s in self.stored])

    def replay(self, settings: Settings, todo: list[StoredLetter], **kwargs: Any) -> WriteReport:
        ids = {s.letter.id for s in todo}
        self.replayed += sorted(ids)
        done = LetterState(status=LetterStatus.REPLAYED, at=now_ms(), by="test")
        for stored in self.stored:
            if stored.letter.id in ids:
                stored.state = done
        return WriteReport(list(todo), Counter())


@pytest.fixture
def topic(app: Starlette, monkeypatch: pytest.MonkeyPatch) -> _Topic:
    """A fresh read of the dead letters reads this topic, and a replay writes to it."""
    fake = _Topic()
    monkeypatch.setattr(_letteractions, "read_dead_letters", fake.read)
    monkeypatch.setattr(_letteractions, "replay_letters", fake.replay)
    monkeypatch.setattr(dashboard(app).letters, "refresh", lambda *args, **kwargs: None)
    return fake


def _confirmation(page: str) -> dict[str, str]:
    """The hidden fields of a confirmation page's form: what its Confirm button sends."""
    form = re.search(r'<form method="post"[^>]*class="actions">(.*?)</form>', page, re.S)
    assert form is not None, page
    found = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1))
    return {name: html.unescape(value) for name, value in found}


def _heading(page: str) -> str:
    heading = re.search(r"<h1>(.*?)</h1>", page, re.S)
    assert heading is not None, page
    return " ".join(heading.group(1).split())


def test_a_bulk_action_acts_only_on_the_letters_its_confirmation_counted(
    app: Starlette, topic: _Topic
) -> None:
    # One letter indexed; two more on the topic, dead before the count but not indexed yet.
    counted = _add_letter(app, dead_at=now_ms() - 60_000, job_type="report.build")
    topic.add(counted)
    late = [_letter(now_ms() - 30_000 + n, "report.build") for n in range(2)]
    for letter in late:
        topic.add(letter)
    client = _client(app)
    token = _csrf(client)
    asked = client.post("/dead-letters/replay", data={"csrf": token, "type": "report.*"})
    assert _heading(asked.text) == "Replay 1 dead letter?"

    answer = client.post("/dead-letters/replay", data=_confirmation(asked.text))
    assert topic.replayed == []  # 3 match now, not the 1 confirmed: nothing is done
    assert answer.status_code == 200
    assert _heading(answer.text) == "Replay 3 dead letters?"
    changed = re.search(r'id="count-changed"[^>]*>(.*?)</p>', answer.text, re.S)
    assert changed is not None, answer.text
    assert "1 pending then" in " ".join(changed.group(1).split())

    again = client.post("/dead-letters/replay", data=_confirmation(answer.text))
    assert again.status_code == 303
    assert _notice(again.headers["location"]) == "3 dead letters replayed."
    assert sorted(topic.replayed) == sorted(s.letter.id for s in topic.stored)


def test_a_replay_confirmation_counts_no_letter_with_nothing_to_send(
    app: Starlette, topic: _Topic
) -> None:
    """A letter holding neither a job nor the raw bytes (too large to keep) cannot be replayed:
    the confirmation does not offer it, and the replay says it was left."""
    sendable = _add_letter(app, dead_at=now_ms() - 60_000, job_type="report.build")
    empty = replace(
        _letter(now_ms() - 50_000, "report.build"), id="dl-empty", job=None, reason="too_large"
    )
    undecodable = replace(
        _letter(now_ms() - 40_000, "report.build"), id="dl-raw", job=None, raw_value=b"\x00"
    )
    index = dashboard(app).letters
    with index._lock:
        index._fold([StoredLetter(empty, 0, 1), StoredLetter(undecodable, 0, 2)], [])
    for letter in (sendable, empty, undecodable):
        topic.add(letter)
    client = _client(app)
    asked = client.post("/dead-letters/replay", data={"csrf": _csrf(client), "type": "report.*"})
    assert _heading(asked.text) == "Replay 2 dead letters?"  # the raw bytes can go back
    done = client.post("/dead-letters/replay", data=_confirmation(asked.text))
    assert sorted(topic.replayed) == sorted([sendable.id, "dl-raw"])
    assert _notice(done.headers["location"]) == (
        "2 dead letters replayed; 1 holds neither a job nor the raw message, so nothing to "
        "replay: discard it."
    )


def test_a_confirmation_sent_again_after_its_letters_were_replayed_replays_nothing(
    app: Starlette, topic: _Topic
) -> None:
    for n in range(2):
        topic.add(_add_letter(app, dead_at=now_ms() - 60_000 + n, job_type="report.build"))
    client = _client(app)
    token = _csrf(client)
    asked = client.post("/dead-letters/replay", data={"csrf": token, "type": "report.*"})
    confirmation = _confirmation(asked.text)
    first = client.post("/dead-letters/replay", data=confirmation)
    assert _notice(first.headers["location"]) == "2 dead letters replayed."
    # The same letters match, now replayed: not a changed count, and skipped.
    second = client.post("/dead-letters/replay", data=confirmation)
    assert second.status_code == 303
    assert _notice(second.headers["location"]).startswith("0 dead letters replayed; 2 already")
    assert len(topic.replayed) == 2


def test_a_confirmation_without_the_digest_of_its_count_acts_on_nothing(
    app: Starlette, topic: _Topic
) -> None:
    topic.add(_add_letter(app, dead_at=now_ms() - 60_000))
    client = _client(app)
    form = {"csrf": _csrf(client), "confirm": "yes", "at": str(now_ms()), "type": "email.*"}
    answer = client.post("/dead-letters/replay", data=form)
    assert answer.status_code == 200
    assert _heading(answer.text) == "Replay 1 dead letter?"
    assert topic.replayed == []


@pytest.mark.parametrize("caught_up", [False, True])
def test_the_confirmation_says_when_its_count_may_be_short(app: Starlette, caught_up: bool) -> None:
    _add_letter(app, dead_at=now_ms() - 60_000)
    dashboard(app).letters._caught_up = caught_up
    client = _client(app)
    asked = client.post("/dead-letters/replay", data={"csrf": _csrf(client), "type": "email.*"})
    assert _heading(asked.text) == "Replay 1 dead letter?"
    warning = re.search(r'id="count-indexing"[^>]*>(.*?)</p>', asked.text, re.S)
    if caught_up:
        assert warning is None
    else:
        assert warning is not None
        assert "1 dead letters so far, so this count may be short" in warning.group(1)


def test_the_count_before_an_action_is_taken_off_the_event_loop(app: Starlette) -> None:
    index = dashboard(app).letters
    query = index.query
    on_loop: list[bool] = []

    def recording_query(*args: Any, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            on_loop.append(False)
        else:
            on_loop.append(True)
        return query(*args, **kwargs)

    client = _client(app)
    token = _csrf(client)
    index.query = recording_query  # type: ignore[method-assign]
    answer = client.post("/dead-letters/replay", data={"csrf": token, "type": "email.*"})
    assert answer.status_code == 200
    assert on_loop == [False]


def test_a_planted_csrf_cookie_is_replaced_and_never_accepted(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page of another port of this host can set ``pipeline_csrf`` for it and post a form
    repeating the value: refused. A browser holding such a cookie gets a new one with its
    next page, and its own forms work."""
    monkeypatch.setattr(_schedules, "read_rows", lambda settings, timeout: [])
    calls: list[str] = []

    def pause(settings: object, name: str, timeout: float) -> bool:
        calls.append(name)
        return True  # it was not paused: the record was written

    monkeypatch.setattr(_schedules, "pause_schedule", pause)
    planted = _client(app)
    planted.cookies.set("pipeline_csrf", "planted")
    forged = planted.post("/schedules/nightly/pause", data={"csrf": "planted"})
    assert forged.status_code == 403
    page = planted.get("/schedules")
    token = page.headers["set-cookie"].split("pipeline_csrf=", 1)[1].split(";", 1)[0]
    assert token != "planted"
    browser = _client(app)
    browser.cookies.set("pipeline_csrf", token)
    assert browser.post("/schedules/nightly/pause", data={"csrf": token}).status_code == 303
    assert calls == ["nightly"]
