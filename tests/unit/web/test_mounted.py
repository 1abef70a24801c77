"""The dashboard mounted in another ASGI application, whose lifespan does not reach it: its
reading starts with the first request, and a Kafka that does not answer shows on every page."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from pipeline import Settings
from pipeline_web import create_app
from tests.waiting import wait_for


def test_a_mounted_dashboard_starts_reading_at_its_first_request() -> None:
    # Nothing listens on port 1: every read fails at once with the address it tried.
    settings = Settings(bootstrap_servers="127.0.0.1:1", namespace="mounted")
    dashboard = create_app(settings, timeout=0.5)
    host = Starlette(routes=[Mount("/", app=dashboard)])
    client = TestClient(host, base_url="http://127.0.0.1", client=("127.0.0.1", 50000))
    monitor = dashboard.state.dashboard.monitor
    try:
        assert monitor.problem is None
        first = client.get("/")
        assert first.status_code == 200
        assert "Reading the namespace" in first.text or "could not be read" in first.text
        assert wait_for(lambda: monitor.problem is not None, 30)
        page = client.get("/")
        assert "Kafka could not be read" in page.text
        assert "127.0.0.1:1" in page.text
        health = client.get("/healthz")
        assert health.status_code == 503
        assert health.text.startswith("kafka: ")
        outside = TestClient(host, client=("10.0.0.7", 50000)).get("/")
        assert outside.status_code == 403  # no credentials: loopback clients only
    finally:
        monitor.stop()
        dashboard.state.dashboard.letters.close()
