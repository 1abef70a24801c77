"""Cross-site request forgery, through the application: the CSRF token is bound to the
principal (a token issued to someone else, or planted by a sibling site, is not one), a POST
a browser says comes from another site is refused (the login form's too, counting no failed
login), and over HTTPS the cookie is a ``__Host-`` one. The Kafka operations are replaced by
recorders."""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest
from starlette.testclient import TestClient

from pipeline_web import _schedules
from pipeline_web._throttle import MAX_FAILURES

from .conftest import FakeClock, MakeDashboard

if TYPE_CHECKING:
    from starlette.applications import Starlette

TOKEN = "s3cret-token"
PASSWORD = "pa55word"
PAUSE = "/schedules/pause?name=nightly"
MakeApp = Callable[..., "Starlette"]


@pytest.fixture
def make_app(make_dashboard: MakeDashboard) -> MakeApp:
    return functools.partial(make_dashboard, "csrf")


@pytest.fixture
def paused(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The schedules the actions paused (the schedule list reads nothing)."""
    calls: list[str] = []
    monkeypatch.setattr(_schedules, "read_rows", lambda settings, timeout: [])

    def pause(settings: object, name: str, timeout: float) -> bool:
        calls.append(name)
        return True  # it was not paused: the record was written

    monkeypatch.setattr(_schedules, "pause_schedule", pause)
    return calls


def _client(
    app: Starlette, base_url: str = "http://127.0.0.1", address: str = "10.0.0.7"
) -> TestClient:
    return TestClient(app, base_url=base_url, client=(address, 50000), follow_redirects=False)


def _logged_in(app: Starlette, base_url: str = "http://127.0.0.1") -> tuple[TestClient, str]:
    """A browser logged in with the token, and the CSRF token of its pages."""
    browser = _client(app, base_url)
    assert browser.post("/login", data={"token": TOKEN}).status_code == 303
    page = browser.get("/dead-letters")
    assert page.status_code == 200
    cookie = "__Host-pipeline_csrf" if base_url.startswith("https:") else "pipeline_csrf"
    token = browser.cookies[cookie]
    assert f'value="{token}"' in page.text
    return browser, token


def _basic(password: str = PASSWORD) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"ops:{password}".encode()).decode()}


# --- the token is bound to the principal --------------------------------------------------------


def test_a_stranger_at_the_login_page_gets_no_csrf_token(make_app: MakeApp) -> None:
    """The login page is open to anyone: a CSRF cookie it gave would be one to plant in an
    operator's browser."""
    for app in (make_app(token=TOKEN), make_app(username="ops", password=PASSWORD)):
        stranger = _client(app)
        for cookies in ({}, {"pipeline_session": "1800000000." + "0" * 64}):
            stranger.cookies.clear()
            for name, value in cookies.items():
                stranger.cookies.set(name, value)
            page = stranger.get("/login")
            assert page.status_code == 200
            assert "pipeline_csrf" not in page.headers.get("set-cookie", "")


def test_a_token_issued_to_another_session_is_refused_in_an_operators_browser(
    make_app: MakeApp, paused: list[str]
) -> None:
    """A sibling subdomain can plant a CSRF cookie in the operator's browser (a cookie for the
    parent domain) and post a form repeating it: a token issued to another session, or given
    to anyone at the login page, is not the operator's."""
    clock = FakeClock()
    app = make_app(token=TOKEN, clock=clock)
    stranger = _client(app, address="203.0.113.9")
    stranger.get("/login")
    given = stranger.cookies.get("pipeline_csrf")  # none now: the old dashboard gave one
    _, others = _logged_in(app)
    clock.now += 1  # another session
    operator, own = _logged_in(app)
    assert own != others
    session = operator.cookies["pipeline_session"]
    for planted in filter(None, (given, others)):
        forged = _client(app, address="198.51.100.7").post(
            PAUSE,
            data={"csrf": planted},
            headers={"cookie": f"pipeline_session={session}; pipeline_csrf={planted}"},
        )
        assert forged.status_code == 403, forged.text
        assert "CSRF token" in forged.text
    assert paused == []
    assert operator.post(PAUSE, data={"csrf": own}).status_code == 303
    assert paused == ["nightly"]


def test_with_basic_credentials_a_token_needs_them(make_app: MakeApp, paused: list[str]) -> None:
    """A browser sends basic credentials it holds with any request to the dashboard: a CSRF
    cookie got without them is no token with them."""
    app = make_app(username="ops", password=PASSWORD)
    stranger = _client(app, address="203.0.113.9")
    stranger.get("/login")
    given = stranger.cookies.get("pipeline_csrf") or "planted"
    forged = _client(app).post(
        PAUSE, data={"csrf": given}, headers={**_basic(), "cookie": f"pipeline_csrf={given}"}
    )
    assert forged.status_code == 403
    operator = _client(app)
    assert operator.get("/dead-letters", headers=_basic()).status_code == 200
    token = operator.cookies["pipeline_csrf"]
    assert operator.post(PAUSE, data={"csrf": token}, headers=_basic()).status_code == 303
    assert paused == ["nightly"]


def test_over_https_the_csrf_cookie_is_a_host_cookie_and_a_plain_one_is_not_read(
    make_app: MakeApp, paused: list[str]
) -> None:
    """Over HTTPS the cookie is ``__Host-pipeline_csrf``, which no other site can set; a
    ``pipeline_csrf`` cookie (one a sibling subdomain can set) is not read there."""
    app = make_app(token=TOKEN)
    operator, token = _logged_in(app, "https://dash.example.com")
    assert "pipeline_csrf" not in operator.cookies
    session = operator.cookies["pipeline_session"]
    plain = _client(app, "https://dash.example.com").post(
        PAUSE,
        data={"csrf": token},
        headers={"cookie": f"pipeline_session={session}; pipeline_csrf={token}"},
    )
    assert plain.status_code == 403
    assert operator.post(PAUSE, data={"csrf": token}).status_code == 303
    assert paused == ["nightly"]


# --- a POST from another site -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "accepted"),
    [
        ({}, True),  # a script, an old browser: the token decides
        ({"Sec-Fetch-Site": "same-origin"}, True),
        ({"Sec-Fetch-Site": "same-origin", "Origin": "http://rewritten:8180"}, True),
        ({"Origin": "http://127.0.0.1"}, True),
        ({"Origin": "http://127.0.0.1:80"}, True),
        ({"Origin": "HTTP://127.0.0.1"}, True),
        ({"Sec-Fetch-Site": "same-site"}, False),  # a sibling subdomain, another port
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Sec-Fetch-Site": "none"}, False),
        ({"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1"}, False),
        ({"Origin": "http://evil.example.com"}, False),
        ({"Origin": "http://127.0.0.1:8181"}, False),
        ({"Origin": "https://127.0.0.1"}, False),
        ({"Origin": "null"}, False),
        ({"Origin": "http://127.0.0.1:x"}, False),
    ],
)
def test_a_post_a_browser_says_comes_from_elsewhere_is_refused(
    make_app: MakeApp, paused: list[str], headers: dict[str, str], accepted: bool
) -> None:
    app = make_app(token=TOKEN)
    operator, token = _logged_in(app)
    answer = operator.post(PAUSE, data={"csrf": token}, headers=headers)
    assert answer.status_code == (303 if accepted else 403), answer.text
    assert paused == (["nightly"] if accepted else [])
    if not accepted:
        assert "another site" in answer.text
        logout = operator.post("/logout", data={"csrf": token}, headers=headers)
        assert logout.status_code == 403
        assert operator.get("/dead-letters").status_code == 200  # still logged in


def test_the_origin_is_the_scheme_and_host_the_server_saw(
    make_app: MakeApp, paused: list[str]
) -> None:
    """The dashboard's own origin is its request's scheme (behind a proxy, as the server set
    it from the headers it trusts) and ``Host`` header, as for the Host check without
    credentials: an IPv6 name, a port, a name in capitals."""
    app = make_app(token=TOKEN)
    operator, token = _logged_in(app, "https://dash.example.com:8443")
    for origin in ("http://dash.example.com:8443", "https://dash.example.com"):
        refused = operator.post(PAUSE, data={"csrf": token}, headers={"Origin": origin})
        assert refused.status_code == 403
    origin = "https://DASH.example.com:8443"
    assert operator.post(PAUSE, data={"csrf": token}, headers={"Origin": origin}).status_code == 303
    local = make_app()  # no credentials: loopback clients, by a loopback name
    browser = _client(local, "http://[::1]:8180", address="::1")
    assert browser.get("/dead-letters").status_code == 200
    token = browser.cookies["pipeline_csrf"]
    for origin, status in (("http://[::1]:8180", 303), ("http://localhost:8180", 403)):
        answer = browser.post(PAUSE, data={"csrf": token}, headers={"Origin": origin})
        assert answer.status_code == status
    assert paused == ["nightly", "nightly"]


def test_a_login_posted_from_another_site_is_refused_and_counts_no_failure(
    make_app: MakeApp,
) -> None:
    """Another site could make an operator's browser post wrong tokens to /login until its
    address is locked out (and automation sharing it): refused, and not counted."""
    app = make_app(token=TOKEN)
    victim = _client(app, "https://dash.example.com")
    for n in range(2 * MAX_FAILURES):
        headers = (
            {"Origin": "https://evil.example.net", "Sec-Fetch-Site": "cross-site"}
            if n % 2
            else {"Origin": "https://evil.example.net"}
        )
        forged = victim.post("/login", data={"token": f"x{n}"}, headers=headers)
        assert forged.status_code == 403, (n, forged.text)
    # Nor can another site log the browser in (with a token of its own).
    forged = victim.post("/login", data={"token": TOKEN}, headers={"Sec-Fetch-Site": "same-site"})
    assert forged.status_code == 403
    assert "pipeline_session" not in forged.headers.get("set-cookie", "")
    assert victim.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    own = {"Origin": "https://dash.example.com", "Sec-Fetch-Site": "same-origin"}
    assert victim.post("/login", data={"token": TOKEN}, headers=own).status_code == 303
