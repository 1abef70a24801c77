"""Who may use the dashboard, and which requests may change anything.

Authentication, by ``web.*`` settings:

- none set: only loopback clients are served (``pipeline web`` also refuses to listen
  elsewhere); they act as ``local``. A request must also name the dashboard (its ``Host``)
  by a loopback name or one of ``web.allowed_hosts``, or it is refused with 400: a browser
  names the site of the page it runs, so a site whose name an attacker rebinds to 127.0.0.1
  (DNS rebinding) does not reach the dashboard;
- ``web.token``: ``Authorization: Bearer <token>``, or the token typed once at ``/login``,
  which sets a session cookie holding its issue time and an HMAC of that time keyed by the
  token (never the token itself). It is accepted for ``web.session_max_age_s``; a new token
  ends every session, and ``POST /logout`` clears the browser's;
- ``web.username`` and ``web.password``: HTTP basic authentication.

Credentials that fail (at ``/login`` or in the ``Authorization`` header) count against the
client's address; too many lock it out for a while (:class:`~._throttle.LoginThrottle`).

Which requests may change anything (the CSRF token, and where a POST comes from) is
``_csrf``'s; it asks the gate who a request is from (:meth:`Gate.csrf_principal`).
The session cookie is HttpOnly, and ``Secure`` when the request came over HTTPS. Secrets are
compared in constant time and never rendered or logged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ._throttle import LoginThrottle

if TYPE_CHECKING:
    from collections.abc import Callable

    from starlette.requests import Request

    from pipeline._websettings import WebSettings

SESSION_COOKIE = "pipeline_session"
CLOCK_SKEW_S = 60
"""How far in the future a session's issue time may be: replicas' clocks differ a little."""
# /logout only clears the session cookie, so it needs no session: one that has just expired
# can still log out (it is CSRF-checked all the same).
_OPEN_PATHS = ("/login", "/logout", "/static/", "/healthz")
# A session cookie: its issue time (Unix seconds, ASCII digits only) and its HMAC in hex.
_SESSION = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})")


def is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str | None) -> str | None:
    """The name of a ``Host`` header, lowercased, without its port: ``[::1]:8180`` is ``::1``."""
    if not header:
        return None
    if header.startswith("["):
        name, bracket, _ = header[1:].partition("]")
        return name.lower() if bracket else None
    return header.rpartition(":")[0].lower() if ":" in header else header.lower()


def same_secret(given: str, expected: str) -> bool:
    """Whether ``given`` equals ``expected``, compared in constant time."""
    return hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True, slots=True)
class Gate:
    """The dashboard's authentication and CSRF checks for one :class:`WebSettings`, with the
    clock its sessions age by (tests give a fake one)."""

    web: WebSettings
    clock: Callable[[], float] = time.time
    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    """Failed credential attempts per client address, and the addresses locked out."""
    _process_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    """Signs the CSRF tokens and notices when no credentials are set (one process serves
    then)."""

    def mac(self, purpose: str, message: str) -> str:
        """An HMAC of ``message`` for ``purpose`` (``csrf``, ``csrf-principal``, ``notice``),
        keyed by the credentials (replicas with the same ones agree), or by a key of the
        process without them; a value signed for one purpose is not one for another."""
        web = self.web
        if web.token is not None:
            secret = web.token.get_secret_value().encode()
        elif web.username is not None and web.password is not None:
            secret = f"{web.username}:{web.password.get_secret_value()}".encode()
        else:
            secret = self._process_key
        key = hashlib.sha256(f"pipeline-web-{purpose}:".encode() + secret).digest()
        return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()

    def session_value(self) -> str:
        """The session cookie a correct token earns now: its issue time and an HMAC of that
        time keyed by the token (not the token), so a new token ends every session."""
        issued = str(int(self.clock()))
        return f"{issued}.{self._session_mac(issued)}"

    def session_valid(self, cookie: str | None) -> bool:
        """Whether ``cookie`` is a session this token issued, neither too old nor from the
        future (beyond :data:`CLOCK_SKEW_S`)."""
        if not self.session_signed(cookie):
            return False
        assert cookie is not None
        age = self.clock() - int(cookie.partition(".")[0])
        return -CLOCK_SKEW_S <= age <= self.web.session_max_age_s

    def session_signed(self, cookie: str | None) -> bool:
        """Whether ``cookie`` is a session this token issued, however old: only a client that
        had the token can hold one."""
        if self.web.token is None or cookie is None:
            return False
        found = _SESSION.fullmatch(cookie)
        if found is None:
            return False
        issued, mac = found.groups()
        return same_secret(mac, self._session_mac(issued))

    def _session_mac(self, issued: str) -> str:
        assert self.web.token is not None
        key = self.web.token.get_secret_value().encode()
        message = b"pipeline-web-session:" + issued.encode()
        return hmac.new(key, message, hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        return self.web.token is not None and same_secret(given, self.web.token.get_secret_value())

    def host_allowed(self, request: Request) -> bool:
        """Whether ``request`` names the dashboard by a loopback name or an allowed one."""
        name = host_name(request.headers.get("host"))
        return is_loopback(name) or name in self.web.allowed_hosts

    def who(self, request: Request) -> str | None:
        """The user a request is from, or None when it is not authenticated."""
        web = self.web
        if not web.auth_enabled:
            local = is_loopback(client_address(request)) and self.host_allowed(request)
            return "local" if local else None
        if self._bearer_matches(request):
            return "token"
        if self.session_valid(request.cookies.get(SESSION_COOKIE)):
            return "token"
        return self._basic_user(request)

    def csrf_principal(self, request: Request) -> str | None:
        """What a CSRF token of ``request`` is bound to (see ``_csrf``), with credentials set:
        its bearer token, its session cookie (an expired one too, so that it can still log
        out), or its basic user; None when it has none of them (a stranger at the login page).
        Without credentials, None: the token is bound to a random cookie of the browser."""
        if not self.web.auth_enabled:
            return None
        if self._bearer_matches(request):
            return "bearer"
        session = request.cookies.get(SESSION_COOKIE)
        if session is not None and self.session_signed(session):
            return f"session:{session}"
        user = self._basic_user(request)
        return None if user is None else f"user:{user}"

    def _bearer_matches(self, request: Request) -> bool:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(value.strip())

    def _basic_user(self, request: Request) -> str | None:
        """The user of ``request``'s basic credentials when they are the right ones."""
        web = self.web
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if web.username is None or web.password is None or scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except ValueError:  # not base64 (or not ASCII at all), or not UTF-8
            return None
        right = web.password.get_secret_value()
        if same_secret(user, web.username) and same_secret(password, right):
            return user
        return None

    def presents_credentials(self, request: Request) -> bool:
        """Whether ``request`` offers credentials this dashboard checks in its
        ``Authorization`` header: a bearer token, or basic credentials, when set."""
        scheme = request.headers.get("authorization", "").partition(" ")[0].lower()
        web = self.web
        return (scheme == "bearer" and web.token is not None) or (
            scheme == "basic" and web.username is not None
        )

    def admit(self, request: Request) -> tuple[str | None, Response | None]:
        """Who ``request`` is from, and the response refusing it (None when it may go on).
        Credentials in its header that fail count against its client's address, and an
        address locked out is refused with 429 before they are checked (see ``_throttle``);
        once per request, then."""
        client = client_address(request)
        guessing = self.presents_credentials(request)
        if guessing and (wait := self.throttle.retry_after(client)) is not None:
            return None, too_many_failures(wait)
        who = self.who(request)
        if guessing and who is None:
            self.throttle.failed(client)
        return who, self._refusal(request, who)

    def refusal(self, request: Request) -> Response | None:
        """The response refusing ``request``, or None when it may go on."""
        return self._refusal(request, self.who(request))

    def _refusal(self, request: Request, who: str | None) -> Response | None:
        web = self.web
        if not web.auth_enabled:
            return self._local_refusal(request)
        if request.url.path.startswith(_OPEN_PATHS) or who is not None:
            return None
        if web.username is not None:
            return PlainTextResponse(
                "credentials required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="pipeline", charset="UTF-8"'},
            )
        if request.method == "GET":
            return RedirectResponse(f"/login?next={_here(request)}", status_code=303)
        return PlainTextResponse("a token is required (Authorization: Bearer)", status_code=401)

    def _local_refusal(self, request: Request) -> Response | None:
        """Without credentials: loopback clients only (the open paths excepted), and on every
        path only by a name of this machine, which a rebound site name is not."""
        local = is_loopback(client_address(request))
        if not request.url.path.startswith(_OPEN_PATHS) and not local:
            return PlainTextResponse(
                "this dashboard has no credentials set, so it serves this machine only "
                "(set web.token, or web.username and web.password, to serve others)",
                status_code=403,
            )
        if not self.host_allowed(request):
            return PlainTextResponse(
                "this dashboard has no credentials set, so it answers only to localhost and "
                "loopback addresses: open it as http://127.0.0.1:<port>/, or add the host name "
                "to web.allowed_hosts",
                status_code=400,
            )
        return None


def too_many_failures(wait: int) -> Response:
    """The refusal of an attempt from an address locked out for ``wait`` more seconds."""
    return PlainTextResponse(
        f"too many failed logins from this address: try again in {wait} s",
        status_code=429,
        headers={"Retry-After": str(wait)},
    )


def client_address(request: Request) -> str | None:
    """The address ``request`` came from, as the server saw it: behind a proxy, the one the
    server took from the proxy's forwarded header, if it trusts it (see :func:`is_https`)."""
    return request.client.host if request.client is not None else None


def _here(request: Request) -> str:
    """The path and query of ``request``, quoted to travel as one query parameter."""
    query = request.url.query
    return quote(f"{request.url.path}?{query}" if query else request.url.path, safe="/")


def set_session_cookie(request: Request, response: Response, gate: Gate) -> None:
    """Log the browser in: a session cookie that lasts ``web.session_max_age_s``."""
    response.set_cookie(
        SESSION_COOKIE,
        gate.session_value(),
        max_age=gate.web.session_max_age_s,
        httponly=True,
        samesite="strict",
        secure=is_https(request),
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    """Log the browser out. A copy of the cookie kept elsewhere stays valid until it expires
    (sessions are not stored): a new ``web.token`` ends every session at once."""
    secure = is_https(request)
    response.delete_cookie(SESSION_COOKIE, httponly=True, samesite="strict", secure=secure)


def is_https(request: Request) -> bool:
    """Whether ``request`` came over HTTPS, so its cookies may be ``Secure`` (a browser would
    not send them back over plain HTTP). Behind a proxy this is the scheme the server set: under
    ``pipeline web``, uvicorn takes X-Forwarded-Proto from the proxies it trusts (loopback,
    or ``FORWARDED_ALLOW_IPS``); the application itself trusts no forwarded header."""
    return request.url.scheme == "https"
