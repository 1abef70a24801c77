"""What the dashboard's responses say besides their page: ``/healthz`` before the first reading
of Kafka, and the caching of pages, on a Kafka that does not answer (nothing listens on port 1)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import anyio.to_thread
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


def test_healthz_does_not_tell_anyone_kafka_s_error(app: Starlette) -> None:
    """``/healthz`` needs no login: it answered with Kafka's error text, broker addresses
    and all."""
    monitor = app.state.dashboard.monitor  # not started here: what a failed reading leaves
    monitor.problem = "Kafka at broker-7.internal:9093 did not answer (SASL user svc-web)"
    health = TestClient(app, base_url="http://127.0.0.1").get("/healthz")
    assert health.status_code == 503
    assert health.text == "kafka: cannot be read"


@pytest.mark.parametrize("path", ["/", "/workers", "/dead-letters", "/jobs", "/login"])
def test_pages_are_not_stored_by_browsers_or_proxies(app: Starlette, path: str) -> None:
    # They hold payloads, errors and the CSRF token: after logging out, or behind a caching
    # proxy, no copy of them must be served again.
    page = _client(app).get(path)
    assert page.status_code == 200, page.text
    assert page.headers.get("cache-control") == "no-store"


@pytest.mark.parametrize("path", ["/", "/dead-letters", "/login", "/static/app.js"])
def test_responses_allow_only_the_dashboard_s_own_scripts_and_styles(
    app: Starlette, path: str
) -> None:
    """A second line behind escaping: a payload that ever reached a page as markup could
    run no inline script, load nothing from elsewhere, nor post a form elsewhere."""
    policy = _client(app).get(path).headers.get("content-security-policy", "")
    directives = dict(d.strip().partition(" ")[::2] for d in policy.split(";"))
    assert directives.get("script-src") == "'self'"
    assert directives.get("default-src") == "'self'"
    assert directives.get("form-action") == "'self'"
    assert directives.get("frame-ancestors") == "'none'"


@pytest.mark.parametrize(
    "refused",
    ["no credentials", "a wrong token", "a login posted from another site"],
)
def test_refusals_carry_the_same_headers(app: Starlette, refused: str) -> None:
    """The responses refused before any route went out without them."""
    client = TestClient(
        app, base_url="http://127.0.0.1", client=("10.0.0.1", 5000), follow_redirects=False
    )
    if refused == "no credentials":
        response = client.post("/schedules/pause?name=x")
    elif refused == "a wrong token":
        response = client.get("/workers", headers={"Authorization": "Bearer wrong"})
    else:
        response = client.post(
            "/login", data={"token": "x"}, headers={"Sec-Fetch-Site": "cross-site"}
        )
    assert response.status_code in (303, 401, 403), response.text  # 303: to the login page
    policy = response.headers.get("content-security-policy", "")
    assert "frame-ancestors 'none'" in policy
    assert response.headers.get("x-frame-options") == "DENY"
    assert response.headers.get("x-content-type-options") == "nosniff"
    assert response.headers.get("cache-control") == "no-store"


def test_static_files_may_be_cached(app: Starlette) -> None:
    style = _client(app).get("/static/app.css")
    assert style.status_code == 200
    assert "no-store" not in style.headers.get("cache-control", "")


def test_healthz_answers_while_every_pool_thread_is_taken(app: Starlette) -> None:
    # Pages run on the server's thread pool and may wait up to the read timeout for Kafka: a
    # probe waiting behind them would fail and have a working dashboard restarted.
    holder = object()
    with _client(app) as client:

        async def take_the_pool() -> float:
            limiter = anyio.to_thread.current_default_thread_limiter()
            tokens = limiter.total_tokens
            limiter.total_tokens = 1
            await limiter.acquire_on_behalf_of(holder)
            return tokens

        async def give_it_back(tokens: float) -> None:
            limiter = anyio.to_thread.current_default_thread_limiter()
            limiter.release_on_behalf_of(holder)
            limiter.total_tokens = tokens

        tokens = client.portal.call(take_the_pool)  # type: ignore[union-attr]
        answers: list[int] = []
        answered = threading.Event()

        def probe() -> None:
            answers.append(client.get("/healthz").status_code)
            answered.set()

        threading.Thread(target=probe, daemon=True).start()
        try:
            assert answered.wait(10), "/healthz waited for a pool thread"
        finally:
            client.portal.call(give_it_back, tokens)  # type: ignore[union-attr]
            answered.wait(10)
        assert answers == [503]  # not read yet: it answered, and said so
