"""What one request may cost the dashboard (a filter's alternatives are bounded), and what a
page that reads Kafka answers when Kafka cannot be read (503, not a page of nothing)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from pipeline._deadletters import LetterFilter, LetterPage
from pipeline._errors import KafkaUnavailableError
from pipeline_web import _jobsview, _letteractions, _letters, _schedules
from pipeline_web._dashboard import JOB_LOOKUPS

from .conftest import MakeDashboard
from .test_web_pages import _Acted, _add_letter, _client, _csrf, dashboard

if TYPE_CHECKING:
    from starlette.applications import Starlette


@pytest.fixture
def app(make_dashboard: MakeDashboard) -> Starlette:
    return make_dashboard("limits")


@pytest.fixture
def scans(app: Starlette, monkeypatch: pytest.MonkeyPatch) -> list[LetterFilter | None]:
    """The filters the index was asked to scan."""
    index = dashboard(app).letters
    query = index.query
    asked: list[LetterFilter | None] = []

    def recording_query(letter_filter: LetterFilter | None, **kwargs: Any) -> LetterPage:
        asked.append(letter_filter)
        return query(letter_filter, **kwargs)

    monkeypatch.setattr(index, "query", recording_query)
    return asked


def _alternatives(count: int) -> str:
    return ",".join(f"email.send{n}*" for n in range(count))


@pytest.mark.parametrize("field", ["type", "reason", "tenant", "id"])
def test_a_filter_of_too_many_alternatives_is_refused_before_any_scan(
    app: Starlette, scans: list[LetterFilter | None], field: str
) -> None:
    # Each alternative is tried on every indexed letter under the index's lock: thousands,
    # in one long link, would hold every page and the background refresh up for minutes.
    _add_letter(app, dead_at=1_000, job_type="email.send1")
    client = _client(app)
    answer = client.get("/dead-letters", params={field: _alternatives(500)})
    assert answer.status_code == 400
    assert f"{field}: at most 20 comma-separated values, got 500" in answer.text
    assert scans == []


def test_a_filter_of_the_most_alternatives_allowed_is_served(
    app: Starlette, scans: list[LetterFilter | None]
) -> None:
    _add_letter(app, dead_at=1_000, job_type="email.send1")
    # Repeated values count once.
    types = f"{_alternatives(_letters.MAX_ALTERNATIVES)},email.send1*"
    answer = _client(app).get("/dead-letters", params={"type": types})
    assert answer.status_code == 200
    assert len(scans) == 1
    assert 'id="match-count"><strong>1</strong>' in answer.text


def test_a_bulk_action_of_too_many_alternatives_is_refused(
    app: Starlette, scans: list[LetterFilter | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    acted = _Acted()
    monkeypatch.setattr(_letteractions, "_act", acted)
    client = _client(app)
    form = {"csrf": _csrf(client), "type": _alternatives(500)}
    scans.clear()  # the page that gave the CSRF token queried the index
    answer = client.post("/dead-letters/replay", data=form)
    assert answer.status_code == 400
    assert scans == []
    assert acted.filters == []


# --- pages that read Kafka when it cannot be read ----------------------------------------------


def _unreachable(*args: object, **kwargs: object) -> NoReturn:
    raise KafkaUnavailableError("Kafka at 127.0.0.1:1 did not answer within 10s")


def test_the_schedules_page_says_kafka_could_not_be_read_with_503_not_no_schedule(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_schedules, "read_rows", _unreachable)
    answer = _client(app).get("/schedules")
    assert answer.status_code == 503
    assert "did not answer within 10s" in answer.text
    assert "No schedule on" not in answer.text  # there may be many: they were not read


def test_a_job_lookup_kafka_could_not_answer_is_503(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_jobsview, "job_history", _unreachable)
    answer = _client(app).get("/jobs", params={"id": "job-1"})
    assert answer.status_code == 503
    assert "did not answer within 10s" in answer.text


def test_job_lookups_beyond_a_few_at_once_are_503_and_the_slots_come_back(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each lookup reads the events topic to its end: a reader asking for many at once must
    # not start as many reads.
    inside = threading.Semaphore(0)
    release = threading.Event()

    def slow_history(*args: Any, **kwargs: Any) -> NoReturn:
        inside.release()
        release.wait(10)
        raise KafkaUnavailableError("Kafka did not answer within 10s")

    monkeypatch.setattr(_jobsview, "job_history", slow_history)
    client = _client(app)
    answers: list[int] = []
    lookups = [
        threading.Thread(target=lambda: answers.append(client.get("/jobs?id=j").status_code))
        for _ in range(JOB_LOOKUPS)
    ]
    for lookup in lookups:
        lookup.start()
    try:
        for _ in lookups:
            assert inside.acquire(timeout=10)
        busy = client.get("/jobs", params={"id": "job-9"})
        assert busy.status_code == 503
        assert f"{JOB_LOOKUPS} job lookups are reading limits.events already" in busy.text
    finally:
        release.set()
        for lookup in lookups:
            lookup.join(10)
    assert answers == [503] * JOB_LOOKUPS  # as slow_history failed them
    monkeypatch.setattr(_jobsview, "job_history", _unreachable)
    assert "did not answer" in client.get("/jobs", params={"id": "job-9"}).text  # slots back
