"""The dashboard's pages and actions through its ASGI application, on a Kafka that does not
answer (nothing listens on port 1): what they do with odd input, odd names and failed reads.
The Kafka operations of the actions are replaced by recorders."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import pytest
from starlette.testclient import TestClient

from pipeline import Settings
from pipeline._deadletters import LetterFilter, StoredLetter
from pipeline._errors import KafkaUnavailableError
from pipeline._job import Job, now_ms
from pipeline._records import DeadLetter, Schedule
from pipeline_web import _letters, _schedules, create_app
from pipeline_web._schedules import ScheduleRow

if TYPE_CHECKING:
    from collections.abc import Iterator

    from starlette.applications import Starlette

    from pipeline_web._dashboard import Dashboard


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Starlette]:
    settings = Settings(bootstrap_servers="127.0.0.1:1", namespace="pages")
    application = create_app(settings, timeout=0.5)
    # These pages need no reading of the namespace: the monitor's thread is not started.
    monkeypatch.setattr(dashboard(application).monitor, "start", lambda: None)
    yield application
    dashboard(application).monitor.stop()
    dashboard(application).letters.close()


def dashboard(app: Starlette) -> Dashboard:
    found: Dashboard = app.state.dashboard
    return found


def _client(app: Starlette, host: str = "127.0.0.1") -> TestClient:
    return TestClient(
        app, base_url=f"http://{host}", client=("127.0.0.1", 50000), follow_redirects=False
    )


def _csrf(client: TestClient) -> str:
    client.get("/dead-letters")
    token = client.cookies.get("pipeline_csrf")
    assert token
    return token


def _add_letter(app: Starlette, dead_at: int, job_type: str = "email.send") -> DeadLetter:
    """A pending dead letter in the index, as a refresh would fold it in."""
    job = Job(id=f"job-{dead_at}", type=job_type, payload=b"{}")
    letter = DeadLetter(
        reason="max_attempts",
        message="smtp timed out",
        source_topic="pages.jobs.default",
        source_partition=0,
        source_offset=0,
        job=job,
        dead_at=dead_at,
    )
    index = dashboard(app).letters
    with index._lock:
        index._fold([StoredLetter(letter, 0, 0)], [])
    return letter


class _Acted:
    """Stands for :func:`_letters._act`: records the filter and acts on nothing."""

    def __init__(self) -> None:
        self.filters: list[LetterFilter] = []

    def __call__(self, *args: Any) -> tuple[list[StoredLetter], int]:
        self.filters.append(args[2])
        return [], 0


@pytest.fixture
def acted(app: Starlette, monkeypatch: pytest.MonkeyPatch) -> _Acted:
    """The actions act on nothing, and the index refresh after them reads nothing."""
    recorder = _Acted()
    monkeypatch.setattr(_letters, "_act", recorder)
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


def test_a_schedule_whose_name_holds_a_slash_can_be_paused_and_triggered(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        ScheduleRow(name, _schedule(name), None, None, [], "") for name in ("team/nightly", "plain")
    ]
    monkeypatch.setattr(_schedules, "read_rows", lambda settings, timeout: rows)
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(
        _schedules, "pause_schedule", lambda s, name, timeout: calls.append(("pause", name))
    )

    def trigger(settings: Settings, name: str, at: int, timeout: float) -> Job:
        calls.append(("trigger", name))
        return Job(id=f"fire-{at}", type="report.build", payload=b"{}")

    monkeypatch.setattr(_schedules, "trigger_schedule", trigger)
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
