"""The dead-letter list pages by position: its "older" and "newer" links carry the place of
the last (first) letter shown, so letters that die, or leave the status asked for, between two
pages neither show again nor get skipped. The index reads an in-memory log (no Kafka)."""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING

import pytest

from ..test_dlq_index import NS, FakeLog, dead_letter, discarded, log
from .conftest import MakeDashboard
from .test_web_pages import _client, dashboard

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.testclient import TestClient

__all__ = ["log"]  # the fixture

SIZE = 3


@pytest.fixture
def app(log: FakeLog, make_dashboard: MakeDashboard) -> Starlette:
    return make_dashboard(NS, page_size=SIZE)


def _die(app: Starlette, log: FakeLog, numbers: range) -> None:
    """Dead letters ``dl-<n>`` written, and read into the dashboard's index."""
    log.add_letters(0, [dead_letter(n) for n in numbers])
    dashboard(app).letters.refresh()


def _discard(app: Starlette, log: FakeLog, numbers: list[int]) -> None:
    log.add_states([discarded(f"dl-{n:03d}") for n in numbers])
    dashboard(app).letters.refresh()


def _page(client: TestClient, url: str) -> tuple[list[str], dict[str, str]]:
    """The ids of the letters a list page shows, newest first, and its pager's links."""
    answer = client.get(url)
    assert answer.status_code == 200, answer.text
    shown = re.findall(r'<tr class="letter[^"]*" data-id="([^"]+)">', answer.text)
    pager = answer.text.split('<p class="pager">', 1)[1].split("</p>", 1)[0]
    links = {
        label: html.unescape(href)
        for href, label in re.findall(r'<a href="([^"]+)"[^>]*>[^a-z]*(newer|older)', pager)
    }
    return shown, links


def _ids(*numbers: int) -> list[str]:
    return [f"dl-{n:03d}" for n in numbers]


def test_the_next_page_starts_after_the_last_letter_shown_while_letters_die(
    app: Starlette, log: FakeLog
) -> None:
    _die(app, log, range(10))
    client = _client(app)
    first, links = _page(client, "/dead-letters?status=all")
    assert first == _ids(9, 8, 7)
    assert "newer" not in links
    _die(app, log, range(10, 15))  # five die while the operator reads page 1

    second, links = _page(client, links["older"])
    assert second == _ids(6, 5, 4)  # by count, page 2 would show 11, 10 and 9
    # Back: the letters right before page 2, as they were shown, not the five new ones.
    assert _page(client, links["newer"])[0] == first

    seen = first + second
    while "older" in links:
        shown, links = _page(client, links["older"])
        seen += shown
    assert seen == _ids(*range(9, -1, -1))


def test_a_letter_left_behind_by_a_status_filter_skips_no_other(
    app: Starlette, log: FakeLog
) -> None:
    _die(app, log, range(10))
    client = _client(app)
    first, links = _page(client, "/dead-letters")  # pending, the default
    assert first == _ids(9, 8, 7)
    _discard(app, log, [9, 8, 5])  # two seen, one not yet: no longer pending

    second, links = _page(client, links["older"])
    assert second == _ids(6, 4, 3)  # by count, page 2 would skip 6 and 4
    seen = first + second
    while "older" in links:
        shown, links = _page(client, links["older"])
        seen += shown
    assert seen == _ids(9, 8, 7, 6, 4, 3, 2, 1, 0)
    # And back up: every page newer than the last, until the newest pending letter.
    back: list[str] = []
    while "newer" in links:
        shown, links = _page(client, links["newer"])
        back = shown + back
    assert back == _ids(7, 6, 4, 3)


def test_a_page_number_of_an_older_link_still_pages_by_count(app: Starlette, log: FakeLog) -> None:
    _die(app, log, range(10))
    client = _client(app)
    second, links = _page(client, "/dead-letters?page=2&type=email.*")
    assert second == _ids(6, 5, 4)
    assert _page(client, links["older"])[0] == _ids(3, 2, 1)
    assert "type=email.%2A" in links["older"]  # the filter stays
    assert _page(client, links["newer"])[0] == _ids(9, 8, 7)
    # Past the end: nothing, and a link to the first page.
    shown, links = _page(client, "/dead-letters?page=9")
    assert shown == []
    assert links == {"newer": "/dead-letters?"}


@pytest.mark.parametrize(
    "query",
    [
        "before=123",
        "before=1.2.x",
        "after=%C2%B2.0.0",
        "before=" + "9" * 30 + ".0.0",
        "before=1.0.0&after=2.0.0",
        "page=2&before=1.0.0",
    ],
)
def test_a_malformed_position_is_a_bad_request(app: Starlette, query: str) -> None:
    assert _client(app).get(f"/dead-letters?{query}").status_code == 400


def test_the_list_shows_who_acted_on_a_letter_and_when(app: Starlette, log: FakeLog) -> None:
    _die(app, log, range(2))
    _discard(app, log, [1])
    answer = _client(app).get("/dead-letters?status=all")
    assert answer.status_code == 200, answer.text
    rows = dict(
        re.findall(r'data-id="([^"]+)">.*?<td class="status">(.*?)</td>', answer.text, re.S)
    )
    assert rows["dl-000"] == "pending"
    assert re.fullmatch(
        r"discarded at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} by ada@ops", rows["dl-001"]
    )
