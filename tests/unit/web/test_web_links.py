"""Links between the pages carry ids whatever characters they hold: a job id is the producer's
(any language may write one), so ``+``, ``&`` or ``#`` in it must reach the page it names."""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING, Any

import pytest

from pipeline._eventlog import JobHistory
from pipeline._job import Job
from pipeline_web import _jobsview

from .conftest import MakeDashboard
from .test_web_pages import _client, serve_letter

if TYPE_CHECKING:
    from starlette.applications import Starlette

JOB_ID = "order+42&tenant=b#1"


@pytest.fixture
def app(make_dashboard: MakeDashboard) -> Starlette:
    return make_dashboard("links")


def test_the_job_link_of_a_letter_looks_up_its_job(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = Job(id=JOB_ID, type="order.ship", payload=b"{}")
    letter = serve_letter(app, monkeypatch, job, "out of stock")
    looked_up: list[str] = []

    def history(settings: Any, job_id: str, **kwargs: Any) -> JobHistory:
        looked_up.append(job_id)
        return JobHistory(job_id, [], scanned=0)

    monkeypatch.setattr(_jobsview, "job_history", history)
    client = _client(app)
    page = client.get(f"/dead-letters/{letter.id}")
    assert page.status_code == 200
    link = re.search(r'<a href="(/jobs\?[^"]*)">', page.text)
    assert link is not None, page.text
    assert client.get(html.unescape(link.group(1))).status_code == 200
    assert looked_up == [JOB_ID]


def test_the_job_page_says_it_left_out_records_it_could_not_decode(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    def history(settings: Any, job_id: str, **kwargs: Any) -> JobHistory:
        return JobHistory(job_id, [], scanned=9, unreadable=3)

    monkeypatch.setattr(_jobsview, "job_history", history)
    page = _client(app).get("/jobs", params={"id": "j1"})
    assert page.status_code == 200
    assert re.search(r'id="unreadable">3 records of this job', page.text), page.text
