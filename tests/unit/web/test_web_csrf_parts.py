"""The CSRF token of the security gate, on its own: without credentials a signed nonce of the
browser's; with them an HMAC of the principal (session, bearer token, basic user)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from pipeline._websettings import WebSettings
from pipeline_web._csrf import csrf_matches, csrf_token
from pipeline_web._security import Gate

from .conftest import FakeClock
from .test_web_parts import _basic, _request

TOKEN = "t0ps3cret"


def test_without_credentials_the_token_must_equal_the_signed_cookie() -> None:
    gate = Gate(WebSettings())
    token = csrf_token(_request(), gate)
    request = _request(cookies={"pipeline_csrf": token})
    assert csrf_token(request, gate) == token  # the browser's cookie is kept
    assert csrf_matches(request, token, gate)
    assert not csrf_matches(request, token[:-1] + "x", gate)
    assert not csrf_matches(request, None, gate)
    assert not csrf_matches(_request(), token, gate)
    # Another site of the same host (another port of localhost) can plant a cookie and repeat
    # it in a form: without this process's signature it is no token.
    for planted in ("abc", "abc.def", f"abc.{'0' * 64}"):
        assert not csrf_matches(_request(cookies={"pipeline_csrf": planted}), planted, gate)
    other = csrf_token(_request(), Gate(WebSettings()))
    assert not csrf_matches(_request(cookies={"pipeline_csrf": other}), other, gate)


def test_with_a_token_the_csrf_token_is_bound_to_the_session() -> None:
    clock = FakeClock()
    web = WebSettings(token=SecretStr(TOKEN))
    gate = Gate(web, clock=clock)
    first = gate.session_value()
    clock.now += 10
    second = gate.session_value()
    token = csrf_token(_request(cookies={"pipeline_session": first}), gate)
    assert token
    sent = _request(cookies={"pipeline_session": first, "pipeline_csrf": token})
    assert csrf_matches(sent, token, gate)
    assert csrf_matches(sent, token, Gate(web, clock=clock))  # a replica with the same token
    assert not csrf_matches(sent, token, Gate(WebSettings(token=SecretStr("another"))))
    # The same token with another session, with a session this token did not sign, or with
    # none: not the principal it was issued for.
    forged = first[:-1] + ("1" if first.endswith("0") else "0")
    for session in (second, forged, None):
        cookies = {"pipeline_csrf": token}
        if session is not None:
            cookies["pipeline_session"] = session
        assert not csrf_matches(_request(cookies=cookies), token, gate)
    assert csrf_token(_request(), gate) == ""  # a stranger gets none
    # An expired session still has its token: it may log out.
    clock.now += web.session_max_age_s + 60
    assert not gate.session_valid(first)
    assert csrf_matches(sent, token, gate)
    # A bearer client has a token of its own.
    bearer = csrf_token(_request(headers={"Authorization": f"Bearer {TOKEN}"}), gate)
    assert bearer not in ("", token)
    assert csrf_token(_request(headers={"Authorization": "Bearer guess"}), gate) == ""


@pytest.mark.parametrize("user", ["ops", "other"])
def test_with_basic_credentials_the_csrf_token_needs_them(user: str) -> None:
    gate = Gate(WebSettings(username="ops", password=SecretStr("p4ss")))
    right = csrf_token(_request(headers=_basic("ops", "p4ss")), gate)
    assert right
    given = csrf_token(_request(headers=_basic(user, "wrong")), gate)
    assert given == ""
    without = _request(cookies={"pipeline_csrf": right})
    assert not csrf_matches(without, right, gate)
    sent = _request(headers=_basic("ops", "p4ss"), cookies={"pipeline_csrf": right})
    assert csrf_matches(sent, right, gate)
