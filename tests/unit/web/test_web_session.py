"""The login session of a token: its cookie's lifetime and flags, and logging out. Time is a
fake clock given to the gate, so that a session ages without waiting."""

from __future__ import annotations

import functools
from collections.abc import Callable
from http.cookies import Morsel, SimpleCookie
from typing import TYPE_CHECKING

import pytest
from pydantic import SecretStr, ValidationError
from starlette.testclient import TestClient

from pipeline import Settings
from pipeline._websettings import WebSettings
from pipeline_web._security import Gate

from .conftest import T0, FakeClock, MakeDashboard
from .test_web_parts import _request

if TYPE_CHECKING:
    from starlette.applications import Starlette


TOKEN = "s3cret-token"
HOUR = 3600


def _gate(clock: FakeClock, token: str = TOKEN, max_age: int = HOUR) -> Gate:
    return Gate(WebSettings(token=SecretStr(token), session_max_age_s=max_age), clock=clock)


# --- the gate -----------------------------------------------------------------------------------


def test_a_session_is_accepted_up_to_its_max_age_and_refused_after_like_none() -> None:
    clock = FakeClock()
    gate = _gate(clock)
    cookie = gate.session_value()
    assert TOKEN not in cookie
    assert gate.who(_request(cookies={"pipeline_session": cookie})) == "token"
    clock.now = T0 + HOUR
    assert gate.who(_request(cookies={"pipeline_session": cookie})) == "token"
    clock.now = T0 + HOUR + 1
    assert gate.who(_request(cookies={"pipeline_session": cookie})) is None
    page = gate.refusal(_request("/dead-letters", cookies={"pipeline_session": cookie}))
    assert page is not None
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=/dead-letters"
    action = gate.refusal(_request("/x", method="POST", cookies={"pipeline_session": cookie}))
    assert action is not None
    assert action.status_code == 401
    # The bearer header does not age: it is the token itself.
    assert gate.who(_request(headers={"Authorization": f"Bearer {TOKEN}"})) == "token"


def test_a_session_issued_in_the_future_is_refused_beyond_a_small_clock_skew() -> None:
    here = FakeClock()
    # Issued by a replica whose clock is a few seconds ahead: fine.
    slightly_ahead = _gate(FakeClock(T0 + 30)).session_value()
    assert _gate(here).who(_request(cookies={"pipeline_session": slightly_ahead})) == "token"
    # Issued "in an hour": a clock that far off, or a forged time, is not trusted.
    far_ahead = _gate(FakeClock(T0 + HOUR)).session_value()
    assert _gate(here).who(_request(cookies={"pipeline_session": far_ahead})) is None


def test_the_issue_time_cannot_be_moved_forward_to_extend_a_session() -> None:
    clock = FakeClock()
    gate = _gate(clock)
    issued, dot, mac = gate.session_value().partition(".")
    assert dot
    assert issued == str(int(T0))
    clock.now = T0 + 2 * HOUR
    assert gate.who(_request(cookies={"pipeline_session": f"{issued}.{mac}"})) is None
    moved = f"{int(clock.now)}.{mac}"
    assert gate.who(_request(cookies={"pipeline_session": moved})) is None


def test_a_new_token_ends_every_session() -> None:
    clock = FakeClock()
    cookie = _gate(clock, token="old-token").session_value()
    request = _request(cookies={"pipeline_session": cookie})
    assert _gate(clock, token="old-token").who(request) == "token"
    assert _gate(clock, token="new-token").who(request) is None


@pytest.mark.parametrize(
    "cookie",
    [
        "",
        "forged",
        str(int(T0)),
        f"{int(T0)}.",
        "." + "0" * 64,
        f"{int(T0)}.{'z' * 64}",
        "\u0661\u0662\u0663." + "0" * 64,  # Arabic-Indic digits: int() reads them, we do not
        "9" * 5000 + "." + "0" * 64,
        "-1." + "0" * 64,
    ],
)
def test_a_malformed_session_cookie_is_refused_like_none(cookie: str) -> None:
    gate = _gate(FakeClock())
    assert gate.who(_request(cookies={"pipeline_session": cookie})) is None
    refusal = gate.refusal(_request("/dead-letters", cookies={"pipeline_session": cookie}))
    assert refusal is not None
    assert refusal.status_code == 303


def test_the_cookie_of_a_fixed_hmac_of_the_token_is_no_longer_a_session() -> None:
    import hashlib
    import hmac

    # What a session cookie held before it carried its issue time: it never expired.
    fixed = hmac.new(TOKEN.encode(), b"pipeline-web-session", hashlib.sha256).hexdigest()
    assert _gate(FakeClock()).who(_request(cookies={"pipeline_session": fixed})) is None


def test_the_session_max_age_is_twelve_hours_unless_set_and_at_least_a_minute() -> None:
    assert WebSettings().session_max_age_s == 12 * HOUR
    assert Settings(web={"session_max_age_s": 60}).web.session_max_age_s == 60
    with pytest.raises(ValidationError, match="session_max_age_s"):
        WebSettings(session_max_age_s=59)


# --- through the application --------------------------------------------------------------------


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


MakeApp = Callable[..., "Starlette"]


@pytest.fixture
def make_app(make_dashboard: MakeDashboard, clock: FakeClock) -> MakeApp:
    """Dashboards of ``web`` settings whose gate reads ``clock``."""
    return functools.partial(make_dashboard, "session", clock=clock)


@pytest.fixture
def app(make_app: MakeApp) -> Starlette:
    return make_app(token=TOKEN, session_max_age_s=HOUR)


def _client(app: Starlette, scheme: str = "http") -> TestClient:
    return TestClient(
        app, base_url=f"{scheme}://127.0.0.1", client=("10.0.0.7", 50000), follow_redirects=False
    )


def _set_cookies(headers: list[str]) -> dict[str, Morsel[str]]:
    """The cookies ``Set-Cookie`` ``headers`` set, with their attributes."""
    found: dict[str, Morsel[str]] = {}
    for header in headers:
        jar: SimpleCookie = SimpleCookie()
        jar.load(header)
        found.update(jar)
    return found


def _log_in(client: TestClient) -> dict[str, Morsel[str]]:
    """Log in at /login; the cookies it set."""
    answer = client.post("/login", data={"token": TOKEN, "next": "/dead-letters"})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/dead-letters"
    return _set_cookies(answer.headers.get_list("set-cookie"))


def test_the_session_cookie_is_httponly_samesite_strict_and_bounded(app: Starlette) -> None:
    client = _client(app)
    session = _log_in(client)["pipeline_session"]
    assert session["httponly"]
    assert session["samesite"].lower() == "strict"
    assert session["max-age"] == str(HOUR)
    assert not session["secure"]  # over plain HTTP a Secure cookie would not come back
    page = client.get("/dead-letters")
    assert page.status_code == 200
    csrf = _set_cookies(page.headers.get_list("set-cookie"))["pipeline_csrf"]
    assert csrf["httponly"]
    assert csrf["samesite"].lower() == "strict"
    assert not csrf["secure"]


def test_both_cookies_are_secure_when_the_request_came_over_https(app: Starlette) -> None:
    client = _client(app, "https")
    assert _log_in(client)["pipeline_session"]["secure"]
    page = client.get("/dead-letters")
    assert page.status_code == 200
    cookies = _set_cookies(page.headers.get_list("set-cookie"))
    # Over HTTPS the CSRF cookie is a __Host- one: only this origin can set it, so it must
    # be Secure, for the path / and without a domain.
    assert "pipeline_csrf" not in cookies
    csrf = cookies["__Host-pipeline_csrf"]
    assert csrf["secure"]
    assert csrf["path"] == "/"
    assert not csrf["domain"]
    assert csrf["httponly"]
    assert csrf["samesite"].lower() == "strict"


def test_a_forwarded_scheme_is_left_to_the_server_in_front(app: Starlette) -> None:
    # The application reads the request's scheme only; a server that trusts its proxy
    # (uvicorn's proxy headers) sets it from X-Forwarded-Proto before the request gets here.
    client = _client(app)
    client.headers["X-Forwarded-Proto"] = "https"
    assert not _log_in(client)["pipeline_session"]["secure"]


def test_an_expired_session_is_sent_to_the_login_page(app: Starlette, clock: FakeClock) -> None:
    client = _client(app)
    _log_in(client)
    assert client.get("/dead-letters").status_code == 200
    clock.now = T0 + HOUR + 1
    page = client.get("/dead-letters")
    assert page.status_code == 303
    assert page.headers["location"] == "/login?next=/dead-letters"
    action = client.post("/schedules/x/pause", data={"csrf": client.cookies["pipeline_csrf"]})
    assert action.status_code == 401


def test_log_out_clears_the_session_and_goes_to_the_login_page(app: Starlette) -> None:
    client = _client(app)
    _log_in(client)
    page = client.get("/dead-letters")
    assert 'action="/logout"' in page.text
    assert "Log out" in page.text
    answer = client.post("/logout", data={"csrf": client.cookies["pipeline_csrf"]})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login"
    cleared = _set_cookies(answer.headers.get_list("set-cookie"))["pipeline_session"]
    assert cleared.value == ""
    assert cleared["max-age"] == "0"
    assert "pipeline_session" not in client.cookies
    assert client.get("/dead-letters").status_code == 303


def test_log_out_needs_the_csrf_token(app: Starlette) -> None:
    client = _client(app)
    _log_in(client)
    client.get("/dead-letters")
    for form in ({}, {"csrf": "not-the-token"}):
        refused = client.post("/logout", data=form)
        assert refused.status_code == 403
        assert "pipeline_session" not in _set_cookies(refused.headers.get_list("set-cookie"))
    assert client.get("/dead-letters").status_code == 200  # still logged in


def test_log_out_works_read_only_and_after_the_session_expired(
    make_app: MakeApp, clock: FakeClock
) -> None:
    app = make_app(token=TOKEN, read_only=True, session_max_age_s=HOUR)
    client = _client(app)
    _log_in(client)
    assert 'action="/logout"' in client.get("/dead-letters").text
    clock.now = T0 + 2 * HOUR
    answer = client.post("/logout", data={"csrf": client.cookies["pipeline_csrf"]})
    assert answer.status_code == 303
    assert answer.headers["location"] == "/login"
    assert "pipeline_session" not in client.cookies


def test_no_log_out_is_offered_without_a_session(app: Starlette, make_app: MakeApp) -> None:
    bearer = _client(app)
    bearer.headers["Authorization"] = f"Bearer {TOKEN}"
    page = bearer.get("/dead-letters")
    assert page.status_code == 200
    assert "/logout" not in page.text
    local = make_app()
    page = TestClient(local, base_url="http://127.0.0.1", client=("127.0.0.1", 1)).get("/")
    assert page.status_code == 200
    assert "/logout" not in page.text
