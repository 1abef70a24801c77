"""Which requests may change anything: where a POST comes from, and its CSRF token.

Every change is a POST: the actions, ``/logout``, and ``/login``. Two checks, both refusing
with 403:

- **Where it comes from** (every POST, ``/login`` included: :func:`cross_site_refusal`, from
  the middleware, before any credential is checked, so a refused login counts no failure).
  A browser says which site a request comes from: a POST whose ``Sec-Fetch-Site`` is present
  and not ``same-origin``, or, without that header, whose ``Origin`` is present and not the
  dashboard's own origin (the scheme the server saw and the ``Host`` header, as the rest of
  the dashboard reads them), is refused. A client that sends neither (a script, an old
  browser) is left to the token.
- **The token** (every POST but ``/login``: :func:`csrf_matches`). The form repeats the
  value of the ``pipeline_csrf`` cookie (HttpOnly, ``SameSite=Strict``; over HTTPS it is
  ``__Host-pipeline_csrf``, which only this origin can set), and that value must be the one
  derived for the request's principal: an HMAC, keyed by the credentials (replicas with the
  same ones agree), of its session cookie, its bearer token or its basic user name
  (:meth:`~._security.Gate.csrf_principal`). A client without the operator's session cannot
  get the operator's token, and a value it obtained for itself and planted in the operator's
  browser (a cookie set by a sibling subdomain or another port of the host) is not it; a
  stranger at the login page gets no token at all. Without credentials (loopback clients
  only) the token is a random nonce of the browser's and its HMAC, keyed by a key of the
  process, as the cookie.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse

from ._security import is_https, same_secret

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ._security import Gate

CSRF_COOKIE = "pipeline_csrf"
HOST_CSRF_COOKIE = f"__Host-{CSRF_COOKIE}"
"""The name over HTTPS: a browser accepts a ``__Host-`` cookie only from this very origin,
``Secure``, for ``Path=/`` and without ``Domain``, as this one is set."""
CSRF_FIELD = "csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def cross_site_refusal(request: Request) -> Response | None:
    """The 403 refusing a POST that a browser says comes from another site or origin, or None
    when it may go on (a GET or HEAD always: links from elsewhere work)."""
    if request.method in SAFE_METHODS or not from_elsewhere(request):
        return None
    return PlainTextResponse(
        "this request comes from another site (Sec-Fetch-Site or Origin): only the "
        "dashboard's own pages may post to it",
        status_code=403,
    )


def from_elsewhere(request: Request) -> bool:
    """Whether ``request``'s browser says it comes from elsewhere: ``Sec-Fetch-Site`` other than
    ``same-origin``, or without it, an ``Origin`` other than the dashboard's own."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site.strip().lower() != "same-origin"
    origin = request.headers.get("origin")
    return origin is not None and not _own_origin(origin, request)


def _own_origin(origin: str, request: Request) -> bool:
    """Whether ``origin`` names the dashboard as ``request`` reached it: its scheme (as the
    server saw it, see :func:`~._security.is_https`) and its ``Host`` header."""
    own = request.url
    try:
        given = urlsplit(origin.strip())
        port = given.port or _DEFAULT_PORTS.get(given.scheme.lower())
        own_port = own.port or _DEFAULT_PORTS.get(own.scheme)
    except ValueError:  # a port that is not a number, or out of range
        return False
    return (
        given.hostname is not None
        and given.scheme.lower() == own.scheme
        and given.hostname == own.hostname
        and port == own_port
    )


def csrf_cookie_name(request: Request) -> str:
    return HOST_CSRF_COOKIE if is_https(request) else CSRF_COOKIE


def csrf_token(request: Request, gate: Gate) -> str:
    """The CSRF token for the forms of ``request``'s page; when its cookie does not hold it
    (none yet, one of another session, one planted), the response sets it (see
    :func:`set_csrf_cookie`). Empty when the request has no principal to bind one to."""
    expected = _expected(request, gate)
    if expected is None and not gate.web.auth_enabled:
        expected = getattr(request.state, "new_csrf", None) or _new_nonce(gate)
    if expected is None:
        return ""
    if request.cookies.get(csrf_cookie_name(request)) != expected:
        request.state.new_csrf = expected
    return expected


def set_csrf_cookie(request: Request, response: Response) -> None:
    token: str | None = getattr(request.state, "new_csrf", None)
    if token is not None:
        response.set_cookie(
            csrf_cookie_name(request),
            token,
            path="/",
            httponly=True,
            samesite="strict",
            secure=is_https(request),
        )


def csrf_matches(request: Request, submitted: str | None, gate: Gate) -> bool:
    """Whether the token ``submitted`` in ``request``'s form is its cookie's value and the one
    derived for its principal."""
    cookie = request.cookies.get(csrf_cookie_name(request))
    expected = _expected(request, gate)
    if not cookie or submitted is None or expected is None:
        return False
    return same_secret(submitted, cookie) and same_secret(submitted, expected)


def _expected(request: Request, gate: Gate) -> str | None:
    """The token ``request`` must carry: the HMAC of its principal with credentials set, or
    without them its cookie if this process signed it; None when there is none."""
    if not gate.web.auth_enabled:
        cookie = request.cookies.get(csrf_cookie_name(request))
        return cookie if cookie and _nonce_signed(cookie, gate) else None
    principal = gate.csrf_principal(request)
    return None if principal is None else gate.mac("csrf-principal", principal)


def _new_nonce(gate: Gate) -> str:
    """A new token without credentials: a random nonce and its HMAC."""
    nonce = secrets.token_urlsafe(24)  # letters, digits, "-" and "_": never a "."
    return f"{nonce}.{gate.mac('csrf', nonce)}"


def _nonce_signed(cookie: str, gate: Gate) -> bool:
    nonce, dot, mac = cookie.rpartition(".")
    return bool(dot) and same_secret(mac, gate.mac("csrf", nonce))
