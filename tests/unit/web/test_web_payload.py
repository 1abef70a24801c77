"""A dead letter's page shows its payload bounded whatever the producer sent: pretty-printed
JSON grows with its nesting (two spaces a level on every line), so the page shows a preview
of it, never hundreds of megabytes."""

from __future__ import annotations

import html
import re
from typing import TYPE_CHECKING

import pytest

from pipeline._human import PAYLOAD_PREVIEW_CHARS
from pipeline._job import Job, PayloadEncoding

from .conftest import MakeDashboard
from .test_web_pages import _client, serve_letter

if TYPE_CHECKING:
    from starlette.applications import Starlette


@pytest.fixture
def app(make_dashboard: MakeDashboard) -> Starlette:
    return make_dashboard("payload")


def _letter_page(app: Starlette, monkeypatch: pytest.MonkeyPatch, payload: bytes) -> str:
    """The page of a dead letter of ``payload`` (JSON), as read back from the topic."""
    job = Job(id="job-1", type="report.build", payload=payload)
    assert job.payload_encoding is PayloadEncoding.JSON
    letter = serve_letter(app, monkeypatch, job, "out of memory")
    page = _client(app).get(f"/dead-letters/{letter.id}")
    assert page.status_code == 200
    return page.text


def _shown_payload(page: str) -> str:
    found = re.search(r'<pre id="payload">(.*?)</pre>', page, re.S)
    assert found is not None, page
    return html.unescape(found.group(1))


def test_a_payload_nested_deep_shows_a_bounded_preview_saying_it_is_cut(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 4 KB of JSON, 200 deep: indented whole, each of its 2,000 numbers on a line of its own
    # behind 400 spaces (800 KB; 900 deep and 200 KB made a page of 170 MB).
    depth, leaves = 200, 2_000
    payload = ("[" * depth + ",".join(["0"] * leaves) + "]" * depth).encode()
    page = _letter_page(app, monkeypatch, payload)
    assert len(page) < PAYLOAD_PREVIEW_CHARS + 20_000
    shown = _shown_payload(page)
    assert shown.endswith(f"\n… truncated ({len(payload):,} bytes in all)")
    assert shown.startswith("[\n  [\n    [")


def test_a_payload_within_the_preview_is_shown_whole_and_indented(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = b'{"to": "ops@example.com", "lines": [1, 2], "note": "caf\\u00e9"}'
    shown = _shown_payload(_letter_page(app, monkeypatch, payload))
    assert shown == (
        '{\n  "to": "ops@example.com",\n  "lines": [\n    1,\n    2\n  ],\n  "note": "café"\n}'
    )


def test_a_payload_holding_a_lone_surrogate_is_shown_escaped(
    app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Valid JSON that no UTF-8 page can hold as it decodes: half of an emoji.
    page = _letter_page(app, monkeypatch, b'{"name": "\\ud83d broken emoji half"}')
    assert _shown_payload(page) == '{\n  "name": "\\ud83d broken emoji half"\n}'
