"""What the dashboard's responses say besides their page: ``/healthz`` before the first reading
of Kafka, and the caching of pages, on a Kafka that does not answer (nothing listens on port 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from starlette.testclient import TestClient

from .conftest import MakeDashboard

if TYPE_CHECKING:
    from starlette.applications import Starlette


TOKEN = "t0ps3cret-token"


@pytest.fixture
def app(make_dashboard: MakeDashboard) -> Starlette:
    return make_dashboard("answers", token=TOKEN)


def _client(app: Starlette) -> TestClient:
    return TestClient(
        app,
        base_url="http://127.0.0.1",
        client=("127.0.0.1", 50000),
        headers={"Authorization": f"Bearer {TOKEN}"},
        follow_redirects=False,
    )


def test_healthz_is_not_ok_before_kafka_was_read_once(app: Starlette) -> None:
    # A probe must not route users to a dashboard that has not read Kafka yet (it may never).
    health = _client(app).get("/healthz")
    assert health.status_code == 503
    assert health.text.startswith("kafka: ")


@pytest.mark.parametrize("path", ["/", "/workers", "/dead-letters", "/jobs", "/login"])
def test_pages_are_not_stored_by_browsers_or_proxies(app: Starlette, path: str) -> None:
    # They hold payloads, errors and the CSRF token: after logging out, or behind a caching
    # proxy, no copy of them must be served again.
    page = _client(app).get(path)
    assert page.status_code == 200, page.text
    assert page.headers.get("cache-control") == "no-store"


def test_static_files_may_be_cached(app: Starlette) -> None:
    style = _client(app).get("/static/app.css")
    assert style.status_code == 200
    assert "no-store" not in style.headers.get("cache-control", "")
